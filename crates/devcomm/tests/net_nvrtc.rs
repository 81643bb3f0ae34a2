//! Compiles the device side of the network transport (`net.cuh`) with NVRTC: every operation
//! for every thread group. No GPU needed. Without NVRTC the test prints SKIPPED and passes,
//! unless `DEVCOMM_REQUIRE_NVRTC` is set (CI sets it).

mod common;
use common::{nvrtc_available, SM90};

use devcomm::jit::{self, KernelSpec};

#[test]
fn net_operations_compile_for_every_group() {
    if !nvrtc_available() {
        return;
    }
    let source = r#"#include "devcomm/devcomm.cuh"
#include "devcomm/net.cuh"
using namespace devcomm;

template <class G>
__device__ bool all_ops(const G& g, const NetQueues& q, int peer, dc_u64* out) {
  dc_u64 s = net_put(g, q, peer, 0, 1, 0, 64, 4096);
  s += net_put_signal(g, q, peer, 0, 1, 4096, 0, 128, 2, 3, 7);
  s += net_signal(g, q, peer, 0, 2, 4, 9);
  s += net_counter_add(g, q, peer, 0, 2, 5, 1);
  const bool ok = net_flush(g, q, peer, 0);
  if (g.thread_rank() == 0) *out = s;
  return ok;
}

extern "C" __global__ void net_probe(NetQueues q, int peer, dc_u64* out, int* ok) {
  bool good = all_ops(Thread{}, q, peer, out);
  good = all_ops(Warp{}, q, peer, out) && good;
  good = all_ops(Block{}, q, peer, out) && good;
  if (!good) *ok = 0;
}
"#;
    let spec = KernelSpec::new("net_probe", source).name_expression("net_probe");
    let module = jit::compile(&spec, SM90).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(&module.cubin[..4], b"\x7fELF");
    assert_eq!(module.lowered_names["net_probe"], "net_probe");
}

/// The routed window operations (`window_net.cuh`) for every thread group.
#[test]
fn routed_window_operations_compile_for_every_group() {
    if !nvrtc_available() {
        return;
    }
    let source = r#"#include "devcomm/devcomm.cuh"
using namespace devcomm;

template <class G>
__device__ bool all_ops(const G& g, const DeviceWindow& w, const WindowNet& n,
                        const RegisteredBuffer* reg, int peer) {
  bool ok = put_routed(g, w, n, peer, 0, 64, 4096);
  ok = put_signal_routed(g, w, n, peer, 128, 0, 64, 1, 7, 1) && ok;
  ok = signal_routed(g, w, n, peer, 2, 9) && ok;
  ok = signal_add_routed(g, w, n, peer, 3, 1, 2) && ok;
  ok = flush_routed(g, w, n, peer, 1) && ok;
  ok = barrier_routed(g, w, n) && ok;
  ok = put_registered_routed(g, w, n, reg, peer, 0, 16, 32, 3) && ok;
  return ok && is_network_peer(w, n, peer);
}

extern "C" __global__ void routed_probe(DeviceWindow w, WindowNet n, const RegisteredBuffer* reg,
                                        int peer, int* ok) {
  bool good = all_ops(Thread{}, w, n, reg, peer);
  good = all_ops(Warp{}, w, n, reg, peer) && good;
  good = all_ops(Block{}, w, n, reg, peer) && good;
  if (!good) *ok = 0;
}
"#;
    let spec = KernelSpec::new("routed_probe", source).name_expression("routed_probe");
    let module = jit::compile(&spec, SM90).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(&module.cubin[..4], b"\x7fELF");
    assert!(module.log.is_empty(), "warnings:\n{}", module.log);
}
