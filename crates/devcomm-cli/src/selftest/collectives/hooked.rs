//! Collectives with the user's hooks: both examples, a kernel loaded late by one rank, and the
//! user's own schedule (`sendrecv_hooked`, `send_hooked`/`recv_hooked`).

use std::time::Duration;

use devcomm::{HookArgs, Hooks};

use super::a2a::{check_f32_a2a, err, f32_a2a_buffers};
use crate::selftest::harness::{doubling_hooks, Ctx};

#[allow(dead_code)]
#[path = "../../../../devcomm/examples/transpose_all_to_all.rs"]
mod transpose_example;

#[allow(dead_code)]
#[path = "../../../../devcomm/examples/fp8_all_to_all.rs"]
mod fp8_example;

type Detail = Result<String, String>;

pub(super) fn check_examples(cx: &Ctx) -> Detail {
    cx.host_barrier()?;
    // Partial edge blocks on the low-latency path; whole blocks (16-byte loads) on the bulk path.
    let t = transpose_example::run_transpose(&cx.comm, &cx.stream, 300, 129, cx.seed)?;
    cx.host_barrier()?;
    let t2 = transpose_example::run_transpose(&cx.comm, &cx.stream, 512, 1024, cx.seed)?;
    cx.host_barrier()?;
    let f = fp8_example::run_fp8(&cx.comm, &cx.stream, 100_003, cx.seed)?;
    cx.host_barrier()?;
    Ok(format!("transpose: {t}; {t2}; fp8: {f}"))
}

/// One rank loads a new collective kernel later than its peers by more than the device wait
/// bound (as a slow NVRTC compile would): the peers' first launch must wait on the host for it
/// (the kernel gate), not time out on the device.
pub(super) fn check_late_loader(cx: &Ctx) -> Detail {
    const HOOKS: &str = "struct LateLoaderCopy {\n\
        using In = float; using Out = float; using Wire = float;\n\
        static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {\n\
          return devcomm::load_tile<float>(c);\n\
        }\n\
        static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {\n\
          devcomm::store_tile<float>(c, t);\n\
        }\n\
        };\n";
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let n = 4096usize;
    let value = |src: usize, i: usize| (src * 1_000_000 + i) as f32;
    let (send, mut recv) = f32_a2a_buffers(cx, n, value)?;
    let hooks = Hooks::<f32, f32>::new("LateLoaderCopy", HOOKS);
    let late = cx.comm.device_timeout() + Duration::from_secs(1);
    cx.sync()?;
    cx.host_barrier()?;
    // The last rank is late as a slow compile makes it: marked as loading meanwhile, so its
    // peers' kernel gates wait past the device timeout (a rank busy with anything else would
    // fail their gates within it).
    if rank == world - 1 {
        devcomm::testing::as_if_loading(&cx.comm, || std::thread::sleep(late)).map_err(err)?;
    }
    cx.comm
        .all_to_all_hooked(&hooks, &send, &mut recv, HookArgs::default(), &cx.stream)
        .map_err(err)?;
    check_f32_a2a(cx, &recv, n, value, "late-loader all_to_all")?;
    cx.host_barrier()?;
    Ok(format!(
        "rank {} loaded the kernel {late:?} after its peers; every rank's result checked",
        world - 1
    ))
}

/// Level 2: the user's own schedule with hooks. A ring step through `sendrecv_hooked` with a
/// `produce` that doubles every value, then a one-way `send_hooked`/`recv_hooked` between
/// neighbours.
pub(super) fn check_hooked_p2p(cx: &Ctx) -> Detail {
    let hooks = doubling_hooks();
    let (rank, world) = (cx.comm.rank(), cx.comm.world_size());
    let (next, prev) = ((rank + 1) % world, (rank + world - 1) % world);
    let val = |s: usize, k: usize| (s * 7_777 + k % 5_003) as f32;
    for n in [3usize, 4096 + 1, 3 << 20] {
        let send = cx
            .stream
            .clone_htod(&(0..n).map(|k| val(rank, k)).collect::<Vec<_>>())
            .map_err(err)?;
        let mut recv = cx.stream.clone_htod(&vec![f32::NAN; n]).map_err(err)?;
        cx.sync()?;
        cx.host_barrier()?;
        let args = devcomm::HookArgs::default();
        cx.comm
            .sendrecv_hooked(&hooks, &send, next, &mut recv, prev, args, &cx.stream)
            .map_err(err)?;
        cx.sync()?;
        let got = cx.stream.clone_dtoh(&recv).map_err(err)?;
        if let Some(k) = (0..n).find(|&k| got[k] != 2.0 * val(prev, k)) {
            return Err(format!(
                "ring {n}: element {k} is {}, expected {}",
                got[k],
                2.0 * val(prev, k)
            ));
        }
        // One way: even ranks send to the odd rank after them.
        cx.host_barrier()?;
        let partner = rank ^ 1;
        if partner < world {
            let mut recv = cx.stream.clone_htod(&vec![f32::NAN; n]).map_err(err)?;
            if rank % 2 == 0 {
                cx.comm
                    .send_hooked(&hooks, &send, partner, args, &cx.stream)
                    .map_err(err)?;
            } else {
                cx.comm
                    .recv_hooked(&hooks, &mut recv, partner, args, &cx.stream)
                    .map_err(err)?;
            }
            cx.sync()?;
            if rank % 2 == 1 {
                let got = cx.stream.clone_dtoh(&recv).map_err(err)?;
                if let Some(k) = (0..n).find(|&k| got[k] != 2.0 * val(partner, k)) {
                    return Err(format!("one-way {n}: element {k} is {}", got[k]));
                }
            }
        }
        cx.host_barrier()?;
    }
    Ok("sendrecv_hooked ring and send_hooked/recv_hooked one way with a doubling produce hook: 3, 4097 and 3M f32, verified".into())
}
