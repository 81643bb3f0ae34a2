//! A communicator of a check's own, for checks that must abort one (mismatches, network
//! failures) and go on with a rebuilt one: every rank builds it on a store port rank 0 picks.

use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use devcomm::{Comm, CommBuilder};
use devcomm_bootstrap::RankInfo;

use super::Ctx;

/// A communicator of its own and the one stream its calls use.
pub(crate) struct Fresh {
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) comm: Comm,
}

/// Builds the `n`-th fresh communicator of check `tag` (every rank passes the same `tag` and
/// `n`, which is advanced here) with device timeout `timeout`.
pub(crate) fn fresh_comm(
    cx: &Ctx,
    tag: &str,
    n: &mut u64,
    timeout: Duration,
) -> Result<Fresh, String> {
    fresh_comm_with(cx, tag, n, |b| b.device_timeout(timeout))
}

/// [`fresh_comm`] with the builder's settings made by `configure` (alike on every rank); like
/// the harness's own communicator, it takes no reduction tuning table.
pub(crate) fn fresh_comm_with(
    cx: &Ctx,
    tag: &str,
    n: &mut u64,
    configure: impl FnOnce(CommBuilder) -> CommBuilder,
) -> Result<Fresh, String> {
    *n += 1;
    let key = format!("__devcomm_cli/fresh/{tag}/port/{n}");
    let store = cx.comm.store();
    let port = if cx.comm.rank() == 0 {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        drop(listener);
        store
            .set(&key, &port.to_le_bytes())
            .map_err(|e| e.to_string())?;
        port
    } else {
        let v = store
            .get(&key, cx.comm.setup_timeout())
            .map_err(|e| e.to_string())?;
        u16::from_le_bytes(v[..2].try_into().map_err(|_| "bad port")?)
    };
    let mut info = RankInfo::from_env().map_err(|e| e.to_string())?;
    info.master_port = port;
    info.master_addr = "127.0.0.1".into();
    let comm = Comm::builder(info)
        .and_then(|b| configure(b.reduce_tune_table(None)).build())
        .map_err(|e| format!("building communicator {n}: {e}"))?;
    let stream = comm.context().new_stream().map_err(|e| e.to_string())?;
    Ok(Fresh { stream, comm })
}
