//! Device identity and peer-access queries.

use std::ffi::{c_char, CStr, CString};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext};

use super::{bind, check, NO_RANK};
use crate::error::{CudaResultExt, Error, Result};

/// What the library needs to know about one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// PCI bus id, normalised to lowercase `dddd:bb:dd.f`, e.g. `0000:19:00.0`.
    pub pci_bus_id: String,
    /// UUID as `nvidia-smi` prints it, `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// Number of streaming multiprocessors.
    pub sm_count: i32,
    /// `(major, minor)`, e.g. `(9, 0)` on Hopper.
    pub compute_capability: (i32, i32),
    /// CUDA device ordinal in this process.
    pub ordinal: usize,
}

impl DeviceInfo {
    /// Queries `ctx`'s device.
    pub(crate) fn query(ctx: &Arc<CudaContext>) -> Result<Self> {
        bind(ctx)?;
        let name = ctx.name().cuda(NO_RANK, "cuDeviceGetName")?;
        let uuid = ctx.uuid().cuda(NO_RANK, "cuDeviceGetUuid")?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .cuda(NO_RANK, "cuDeviceGetAttribute")?;
        let compute_capability = ctx
            .compute_capability()
            .cuda(NO_RANK, "cuDeviceGetAttribute")?;
        Ok(Self {
            name,
            pci_bus_id: pci_bus_id(ctx.cu_device())?,
            uuid: format_uuid(&uuid.bytes.map(|c| c as u8)),
            sm_count,
            compute_capability,
            ordinal: ctx.ordinal(),
        })
    }
}

/// The normalised PCI bus id of a device.
fn pci_bus_id(device: sys::CUdevice) -> Result<String> {
    let mut buf: [c_char; 64] = [0; 64];
    // SAFETY: `buf` holds 64 bytes and we pass that length; the driver NUL-terminates.
    let status = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, device) };
    check(status, "cuDeviceGetPCIBusId")?;
    // SAFETY: NUL-terminated by the driver within the 64 bytes (the last one is still 0 if
    // it wrote fewer; it never writes more than `len`).
    let raw = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    normalise_pci_bus_id(&raw).ok_or_else(|| Error::InvalidArgument {
        op: "cuDeviceGetPCIBusId",
        reason: format!("cannot parse PCI bus id {raw:?}"),
    })
}

/// Normalises a PCI bus id (`[domain:]bus:device.function`, hex, any case, any domain width)
/// to lowercase `dddd:bb:dd.f`, so ids from the driver, `nvidia-smi` and sysfs compare equal.
pub(crate) fn normalise_pci_bus_id(id: &str) -> Option<String> {
    let id = id.trim();
    let (rest, function) = id.rsplit_once('.')?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, device) = match parts.as_slice() {
        [bus, device] => ("0", *bus, *device),
        [domain, bus, device] => (*domain, *bus, *device),
        _ => return None,
    };
    let hex = |s: &str| {
        if s.is_empty() {
            None
        } else {
            u32::from_str_radix(s, 16).ok()
        }
    };
    let (domain, bus, device, function) = (hex(domain)?, hex(bus)?, hex(device)?, hex(function)?);
    if bus > 0xff || device > 0x1f || function > 0x7 || domain > 0xffff {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

/// Formats the 16 UUID bytes as `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub(crate) fn format_uuid(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The device with this PCI bus id, or `None` if it is not visible to this process (e.g.
/// hidden by `CUDA_VISIBLE_DEVICES`).
pub(crate) fn device_by_pci_bus_id(pci_bus_id: &str) -> Result<Option<sys::CUdevice>> {
    let id = CString::new(pci_bus_id).map_err(|_| Error::InvalidArgument {
        op: "cuDeviceGetByPCIBusId",
        reason: format!("PCI bus id {pci_bus_id:?} contains a NUL byte"),
    })?;
    let mut device: sys::CUdevice = 0;
    // SAFETY: valid out-pointer and NUL-terminated string.
    let status = unsafe { sys::cuDeviceGetByPCIBusId(&mut device, id.as_ptr()) };
    match status {
        sys::CUresult::CUDA_SUCCESS => Ok(Some(device)),
        // Not among the visible devices.
        sys::CUresult::CUDA_ERROR_INVALID_DEVICE | sys::CUresult::CUDA_ERROR_INVALID_VALUE => {
            log::debug!("cuDeviceGetByPCIBusId({pci_bus_id}): {status:?}: not visible here");
            Ok(None)
        }
        other => check(other, "cuDeviceGetByPCIBusId").map(|()| None),
    }
}

/// Whether kernels on `ctx`'s device can load and store to the device with this PCI bus id
/// (`cuDeviceCanAccessPeer`). `false` when that device is not visible here; `true` for the
/// device itself.
pub(crate) fn can_access_peer(ctx: &Arc<CudaContext>, peer_pci_bus_id: &str) -> Result<bool> {
    bind(ctx)?;
    let Some(peer) = device_by_pci_bus_id(peer_pci_bus_id)? else {
        return Ok(false);
    };
    let me = ctx.cu_device();
    if peer == me {
        return Ok(true);
    }
    let mut can: std::ffi::c_int = 0;
    // SAFETY: valid out-pointer; both are valid device handles.
    let status = unsafe { sys::cuDeviceCanAccessPeer(&mut can, me, peer) };
    check(status, "cuDeviceCanAccessPeer")?;
    Ok(can != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_bus_ids_are_normalised() {
        assert_eq!(
            normalise_pci_bus_id("0000:19:00.0").as_deref(),
            Some("0000:19:00.0")
        );
        assert_eq!(
            normalise_pci_bus_id("00000000:9A:00.0").as_deref(),
            Some("0000:9a:00.0")
        );
        assert_eq!(
            normalise_pci_bus_id("1B:00.1").as_deref(),
            Some("0000:1b:00.1")
        );
        assert_eq!(
            normalise_pci_bus_id(" 0001:c3:1f.7\n").as_deref(),
            Some("0001:c3:1f.7")
        );
        for bad in [
            "",
            "19:00",
            "0000:19:00.",
            "zz:00.0",
            "0000:19:20.0",
            "0000:100:00.0",
        ] {
            assert_eq!(normalise_pci_bus_id(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn uuid_formats_like_nvidia_smi() {
        let bytes: [u8; 16] = [
            0x5f, 0x4a, 0x2b, 0x10, 0xde, 0xad, 0xbe, 0xef, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ];
        assert_eq!(
            format_uuid(&bytes),
            "GPU-5f4a2b10-dead-beef-0123-456789abcdef"
        );
    }
}
