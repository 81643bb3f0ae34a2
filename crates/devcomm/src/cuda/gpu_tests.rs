//! Single-GPU checks of this layer against the real driver. Ignored by default (CI has no
//! GPU); run with `cargo test -p devcomm --lib -- --ignored` on a machine with one.

use std::os::fd::AsFd;
use std::sync::Arc;

use cudarc::driver::{result, CudaContext};

use super::info::{self, DeviceInfo};
use super::ipc::IpcHandle;
use super::vmm::{self, Mapping, PhysicalMemory};
use super::{pointer, synchronize, DeviceBuffer, ErrorState};
use crate::error::Error;
use crate::handles::DeviceErrorState;

fn ctx() -> Arc<CudaContext> {
    CudaContext::new(0).expect("a CUDA device")
}

#[test]
#[ignore = "needs a GPU"]
fn vmm_memory_round_trips_through_an_fd() {
    let ctx = ctx();
    let g = vmm::granularity(&ctx).unwrap();
    assert!(g.is_power_of_two() && g >= vmm::min_granularity(&ctx).unwrap());
    let mem = PhysicalMemory::create(&ctx, 1000).unwrap();
    assert_eq!(mem.bytes(), g);
    let map = Mapping::new(&ctx, &mem, mem.bytes()).unwrap();
    assert_eq!(map.ptr() % g as u64, 0);

    assert!(pointer::is_vmm(&ctx, map.ptr() + 64).unwrap());
    assert_eq!(
        pointer::mapping_range(&ctx, map.ptr() + 64).unwrap(),
        (map.ptr(), g)
    );
    assert_eq!(pointer::device_ordinal(&ctx, map.ptr()).unwrap(), 0);

    let fd = mem.export_fd().unwrap();
    let imported = PhysicalMemory::import(&ctx, fd.as_fd(), mem.bytes()).unwrap();
    drop(fd);
    let map2 = Mapping::new(&ctx, &imported, imported.bytes()).unwrap();
    assert_ne!(map2.ptr(), map.ptr());

    let data: Vec<u64> = (1..=16).collect();
    // SAFETY: both mappings cover `g` >= 128 bytes of the same memory; nothing else uses it.
    unsafe { result::memcpy_htod_sync(map.ptr(), &data) }.unwrap();
    synchronize(&ctx).unwrap();
    let mut back = vec![0u64; 16];
    // SAFETY: as above.
    unsafe { result::memcpy_dtoh_sync(&mut back, map2.ptr()) }.unwrap();
    assert_eq!(back, data, "the second mapping sees the first one's writes");

    // SAFETY: as above.
    unsafe { super::memset_zero(&ctx, map2.ptr(), 128) }.unwrap();
    synchronize(&ctx).unwrap();
    // SAFETY: as above.
    unsafe { result::memcpy_dtoh_sync(&mut back, map.ptr()) }.unwrap();
    assert_eq!(back, vec![0u64; 16]);

    drop(map2);
    drop(imported);
    drop(map);
    drop(mem);
    synchronize(&ctx).unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn cumemalloc_memory_is_ipc_capable_and_not_vmm() {
    let ctx = ctx();
    let values: Vec<u64> = (0..512).map(|i| i * 3).collect();
    let buf = DeviceBuffer::from_slice(&ctx, &values).unwrap();
    synchronize(&ctx).unwrap();
    let mut back = vec![0u64; 512];
    // SAFETY: `buf` holds 512 u64.
    unsafe { result::memcpy_dtoh_sync(&mut back, buf.ptr()) }.unwrap();
    assert_eq!(back, values);

    let inner = buf.ptr() + 64;
    assert!(!pointer::is_vmm(&ctx, inner).unwrap());
    assert!(pointer::is_legacy_ipc_capable(&ctx, inner).unwrap());
    let (base, size) = pointer::allocation_range(&ctx, inner).unwrap();
    assert_eq!(base, buf.ptr());
    assert!(size >= 4096, "{size}");
    assert_eq!(pointer::device_ordinal(&ctx, inner).unwrap(), 0);
    let handle = IpcHandle::get(&ctx, base).unwrap();
    assert!(handle.as_bytes().iter().any(|&b| b != 0));
}

#[test]
#[ignore = "needs a GPU"]
fn error_state_is_visible_from_the_device_and_aborts_once_raised() {
    let ctx = ctx();
    let state = ErrorState::new(&ctx, 3).unwrap();
    assert_ne!(state.device_ptr(), 0);
    assert_eq!(state.read(), DeviceErrorState::default());
    state.check().unwrap();

    // A device-side write (through the device address) shows up on the host.
    // SAFETY: `abort` is the first byte of the 56-byte state.
    unsafe { result::memset_d8_sync(state.device_ptr(), 1, 1) }.unwrap();
    synchronize(&ctx).unwrap();
    assert_eq!(state.read().abort, 1);
    assert!(matches!(state.check(), Err(Error::Aborted { rank: 3, .. })));
    assert!(matches!(state.check(), Err(Error::Aborted { rank: 3, .. })));

    let other = ErrorState::new(&ctx, 1).unwrap();
    other.raise_abort();
    let mut seen = [DeviceErrorState::default()];
    // SAFETY: the device address maps the 56-byte state.
    unsafe { result::memcpy_dtoh_sync(&mut seen, other.device_ptr()) }.unwrap();
    assert_eq!(seen[0].abort, 1, "the device sees the host's abort");
    assert!(matches!(other.check(), Err(Error::Aborted { rank: 1, .. })));
}

#[test]
#[ignore = "needs a GPU"]
fn device_info_and_peer_queries() {
    let ctx = ctx();
    let info = DeviceInfo::query(&ctx).unwrap();
    eprintln!("{info:?}");
    assert!(info.sm_count > 0);
    assert!(info.compute_capability.0 >= 7);
    assert_eq!(
        info::normalise_pci_bus_id(&info.pci_bus_id).unwrap(),
        info.pci_bus_id
    );
    assert!(
        info.uuid.starts_with("GPU-") && info.uuid.len() == 40,
        "{}",
        info.uuid
    );
    assert_eq!(
        info::device_by_pci_bus_id(&info.pci_bus_id).unwrap(),
        Some(ctx.cu_device())
    );
    assert!(info::can_access_peer(&ctx, &info.pci_bus_id).unwrap());
    assert_eq!(info::device_by_pci_bus_id("0000:ff:1f.7").unwrap(), None);
    assert!(!info::can_access_peer(&ctx, "0000:ff:1f.7").unwrap());
}
