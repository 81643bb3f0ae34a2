//! Collectives with user hooks (docs/COLLECTIVES.md): all-to-all and all-to-all-v as one fused
//! peer x block kernel over the send/recv protocol, with the user's `produce`/`consume` hooks
//! compiled into the copy steps by the JIT.

mod aliasing;
mod hooks;
mod shape;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr};

use crate::abi::coll_launch::CollLaunch;
pub(crate) use crate::abi::coll_launch::{MODE_DEVICE_COUNTS, MODE_PEER_ROWS, MODE_UNIFORM};
use crate::abi::net::NetP2PLaunch;
use crate::cuda::linear_launch;
use crate::error::{CudaResultExt, Error, Result};
use crate::group::{Group, KernelGate};
use crate::jit::Jit;
use crate::jit::KernelSpec;
use crate::p2p::P2P;

pub(crate) use aliasing::{first_written_overlap, overlap, Buf};
pub use hooks::{Hooks, RawHooks};
pub use shape::CollShape;
pub(crate) use shape::{coll_shape, fit_low_latency, THREADS};

/// A loaded collective kernel: the function, its resident blocks per SM, its load gate.
type LoadedKernel = (CudaFunction, u32, Arc<KernelGate>);

/// Device-resident counts of an all-to-all-v, in rows. `send_counts` (and `send_offsets`, when
/// given) are read by the kernel, so a kernel enqueued just before may produce them;
/// `recv_counts` and `recv_offsets` are written by it. Nothing goes through the host.
#[derive(Debug)]
pub struct AllToAllVCounts {
    /// `u64[world]`: rows this rank sends to each peer (itself included).
    pub send_counts: CudaSlice<u64>,
    /// `u64[world]`: first row of each peer's data in the send buffer; `None` packs them in
    /// rank order.
    pub send_offsets: Option<CudaSlice<u64>>,
    /// `u64[world]`, written: rows received from each peer.
    pub recv_counts: CudaSlice<u64>,
    /// `u64[world]`, written: first row of each peer's data in the receive buffer (packed in
    /// rank order).
    pub recv_offsets: CudaSlice<u64>,
}

impl AllToAllVCounts {
    /// Zeroed counts for `world` ranks, allocated on `stream`.
    pub fn new(stream: &Arc<CudaStream>, world: usize) -> Result<Self> {
        let alloc = || {
            stream.alloc_zeros::<u64>(world).map_err(|e| Error::Cuda {
                rank: -1,
                call: "cuMemAlloc (all-to-all-v counts)",
                source: e,
            })
        };
        Ok(Self {
            send_counts: alloc()?,
            send_offsets: None,
            recv_counts: alloc()?,
            recv_offsets: alloc()?,
        })
    }
}

/// What one collective launch moves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CollCall {
    pub op: &'static str,
    pub input: u64,
    pub output: u64,
    /// Elements of the send and receive buffers.
    pub in_elems: u64,
    pub out_elems: u64,
    pub row_len: u64,
    /// Fixed rows per peer (all-to-all) or device counts (all-to-all-v).
    pub rows: u64,
    pub send_counts: u64,
    pub send_offsets: u64,
    pub recv_counts: u64,
    pub recv_offsets: u64,
    pub user: u64,
    /// `handle::MODE_*`.
    pub mode: u32,
    /// Mode `MODE_PEER_ROWS`: rows sent to / received from each peer.
    pub peer_rows: [[u64; 32]; 2],
    /// What both ends compare the call as (`CollLaunch::op`); 0: `mode + 1`.
    pub code: u32,
}

/// The module of `hooks`' collective kernels under `config` (`DEVCOMM_COLL_OPTIONS`, tracing),
/// with the network instantiations in a job with network links: what its load path loads and
/// `crate::kernels::kernel_spec` returns.
pub(crate) fn module_spec(
    hooks: &RawHooks,
    config: &crate::config::Config,
    net: bool,
) -> KernelSpec {
    crate::kernel_load::configured(hooks.spec(net), &config.coll_options, config.trace)
}

/// Per-communicator collective state.
#[derive(Debug)]
pub(crate) struct Collective {
    /// `u64[4]`: variable calls done, arrivals, overflow flag, spare.
    _state: CudaSlice<u64>,
    state_ptr: u64,
    /// The smallest SM count of the group (all ranks use the same blocks per peer).
    sm_count: u32,
    /// Loaded kernels by (hooks key, mixed tuning, network peers), with their resident blocks
    /// per SM.
    functions: Mutex<HashMap<(u64, bool, bool), LoadedKernel>>,
    /// Small plain all-to-alls launch only the blocks their LL plan uses
    /// (`DEVCOMM_COLL_FIT_GRID`).
    fit_grid: bool,
    /// Own-chunk bytes per block of the own chunk's role (`DEVCOMM_COLL_SELF_BLOCK_KIB`).
    self_block_bytes: u64,
}

impl Collective {
    /// Collective: zeroed state and the group's smallest SM count.
    pub(crate) fn new(group: &Arc<Group>, sm_count: i32) -> Result<Self> {
        let rank = group.rank as i32;
        let stream = group.ctx.default_stream();
        let state = stream
            .alloc_zeros::<u64>(4)
            .cuda(rank, "cuMemAlloc (collective state)")?;
        stream.synchronize().cuda(rank, "cuStreamSynchronize")?;
        let state_ptr = {
            let (p, _sync) = state.device_ptr(&stream);
            p
        };
        let tag = group.next_tag("__devcomm/collective/sm_count");
        let all = group
            .store
            .all_gather(&tag, &sm_count.to_le_bytes(), group.setup_timeout)?;
        let sm_min = all
            .iter()
            .filter_map(|b| b.as_slice().try_into().ok().map(i32::from_le_bytes))
            .min()
            .unwrap_or(sm_count)
            .max(1) as u32;
        Ok(Self {
            _state: state,
            state_ptr,
            sm_count: sm_min,
            functions: Mutex::new(HashMap::new()),
            fit_grid: group.config.coll_fit_grid,
            self_block_bytes: group.config.coll_self_block_kib << 10,
        })
    }

    /// The kernel's shape for `world` ranks on the group's smallest GPU (one block per SM):
    /// see [`coll_shape`].
    /// The shape of a launch. `uniform_copy`: a plain all-to-all (copy hooks, `self_bytes` per
    /// peer), whose transfers all carry the input's bytes rounded up to whole 16-byte tiles,
    /// so that the grid can fit them (see [`fit_low_latency`]).
    pub(crate) fn shape(
        &self,
        world: usize,
        max_blocks: u32,
        self_bytes: Option<u64>,
        uniform_copy: bool,
    ) -> CollShape {
        let peer_wire = self_bytes
            .filter(|_| uniform_copy && self.fit_grid)
            .map(|b| b.div_ceil(16) * 16);
        let shape = coll_shape(
            self.sm_count,
            world,
            max_blocks,
            self_bytes,
            self.self_block_bytes,
        );
        fit_low_latency(shape, peer_wire)
    }

    fn function(
        &self,
        group: &Group,
        jit: &Jit,
        hooks: &RawHooks,
        mixed: bool,
        net: bool,
    ) -> Result<LoadedKernel> {
        let poisoned = || Error::Aborted {
            rank: group.rank as i32,
            reason: "a thread panicked while loading kernels".into(),
        };
        let key = (hooks.key, mixed, net);
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(f.clone());
        }
        let spec = module_spec(hooks, &group.config, net);
        let f =
            crate::kernel_load::load(group, jit, &spec)?.function(&hooks.expression(mixed, net))?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
            .cuda(
                group.rank as i32,
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )?;
        let gate = KernelGate::new(
            format!("collective-{:016x}-{mixed}-{net}", hooks.key),
            group.world_size,
        );
        let entry = (f, per_sm, Arc::new(gate));
        self.functions
            .lock()
            .map_err(|_| poisoned())?
            .insert(key, entry.clone());
        Ok(entry)
    }

    /// Checks, then launches one collective. Nothing is written when it returns an error.
    /// `net`: the communicator's network staging and queues (`None`: no link of the job is
    /// `Net`), for the roles of network peers.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch(
        &self,
        group: &Group,
        jit: &Jit,
        p2p: &P2P,
        net: Option<NetP2PLaunch>,
        hooks: &RawHooks,
        call: CollCall,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check_before_launch()?;
        let world = group.world_size;
        let rank = group.rank;
        if world > 32 {
            return Err(Error::InvalidArgument {
                op: call.op,
                reason: format!("world size {world}: collectives support at most 32 ranks"),
            });
        }
        if call.row_len == 0 {
            return Err(Error::InvalidArgument {
                op: call.op,
                reason: "row length 0".into(),
            });
        }
        // Network peers are reachable when the network transport was set up (the job uses
        // it); every other peer must be on NVLink.
        group.mesh.check_nvlink(call.op, net.is_some())?;
        let net_links = match net {
            Some(_) => group
                .mesh
                .network_peers()
                .iter()
                .fold(0u32, |m, &p| m | 1 << p),
            None => 0,
        };
        let net_peers = (0..world)
            .filter(|&p| p != rank && group.topology.tuned_as_net(p))
            .fold(0u32, |m, p| m | 1 << p);
        p2p.bind(group, stream)?;
        // A network peer is tuned as one; the network kernels are instantiated with mixed
        // tuning only.
        let mixed = net_peers != 0 || net_links != 0;
        let (func, per_sm, gate) = self.function(group, jit, hooks, mixed, net_links != 0)?;
        // Every peer this call moves data with has loaded the kernel too (a rank still
        // compiling it would make this launch's device waits time out).
        let peers = (0..world).filter(|&q| {
            call.mode != MODE_PEER_ROWS || call.peer_rows[0][q] > 0 || call.peer_rows[1][q] > 0
        });
        gate.pass(group, peers)?;
        let limits = p2p.limits();
        // The own chunk's input bytes, only where every rank has the same value: both ends of
        // a transfer derive its block count from the shape's blocks per peer, so the shape must
        // be equal on every rank. All-to-all: equal chunks everywhere. Hooked send/recv: the
        // own rank is refused as a peer (`Comm::tiles`), so the own chunk is empty
        // everywhere. Device counts: unknown on the host.
        let self_bytes = match call.mode {
            MODE_UNIFORM => Some(call.rows * call.row_len * hooks.in_size as u64),
            MODE_PEER_ROWS => {
                debug_assert_eq!(call.peer_rows[0][rank], 0, "tiles to the own rank");
                Some(0)
            }
            _ => None,
        };
        let uniform_copy = call.mode == MODE_UNIFORM && hooks.is_copy();
        let shape = self.shape(world, limits.max_blocks, self_bytes, uniform_copy);
        let grid = shape.grid(world);
        if grid > per_sm.max(1) * self.sm_count {
            return Err(Error::InvalidArgument {
                op: call.op,
                reason: format!(
                    "{grid} blocks of {THREADS} threads cannot all be resident ({per_sm} per SM x \
                     {} SMs); the kernel's roles wait on each other, so this would deadlock",
                    self.sm_count
                ),
            });
        }
        let args = CollLaunch {
            p: p2p.base_launch(),
            input: call.input,
            output: call.output,
            send_counts: call.send_counts,
            send_offsets: call.send_offsets,
            recv_counts: call.recv_counts,
            recv_offsets: call.recv_offsets,
            rows: call.rows,
            row_len: call.row_len,
            send_capacity: call.in_elems / call.row_len,
            recv_capacity: call.out_elems / call.row_len,
            user: call.user,
            counters: p2p.counters_base(),
            state: self.state_ptr,
            blocks_per_peer: shape.per_peer,
            net_peers,
            count_slot0: limits.count_slot0(world) as u32,
            mode: call.mode,
            peer_rows: call.peer_rows,
            self_blocks: shape.self_blocks,
            net_links,
            net: net.filter(|_| net_links != 0).unwrap_or_default(),
            op: if call.code != 0 {
                call.code
            } else {
                call.mode + 1
            },
            op_pad: 0,
        };
        let cfg = linear_launch(grid, THREADS);
        let _scope = group.call_scope(stream, || crate::trace::CallInfo {
            op: call.op,
            bytes: call.in_elems * hooks.in_size as u64,
            peers: (0..world).filter(|&q| q != rank).collect(),
            algorithm: format!("{grid} blocks, {} per peer", shape.per_peer),
        });
        // SAFETY: coll_kernel<H, THREADS, MIXED, NET>(CollLaunch) takes exactly this struct by
        // value and enters through enter_after_previous_kernel. Its window, counters and network
        // staging and queues live as long as the communicator; the buffers and count arrays
        // were checked by the caller (sizes from cudarc slices); the kernel reads at most
        // `send_capacity` rows of `input` and writes at most `recv_capacity` rows of `output`
        // (device counts beyond them are refused on the device; a network peer's chunk
        // only after its header matched), and every grid block is resident (checked above),
        // so the roles' waits on each other cannot deadlock.
        unsafe { crate::cuda::launch_struct(stream, &func, cfg, &args, group.pdl) }
            .cuda(rank as i32, "cuLaunchKernelEx (collective)")?;
        Ok(())
    }
}
