//! Collectives with user hooks (docs/COLLECTIVES.md): all-to-all and all-to-all-v as one fused
//! peer x block kernel over the send/recv protocol, with the user's `produce`/`consume` hooks
//! compiled into the copy steps by the JIT.

pub mod handle;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr};

use crate::cuda::linear_launch;
use crate::error::{CudaResultExt, Error, Result};
use crate::group::{Group, KernelGate};
use crate::jit::{Jit, KernelSpec};
use crate::p2p::P2P;
use crate::topology::LinkKind;
use handle::CollLaunch;
pub use handle::{MODE_DEVICE_COUNTS, MODE_PEER_ROWS, MODE_UNIFORM};

/// Threads per block of the collective kernel (16 warps: 16 bulk channels per block).
pub const THREADS: u32 = 512;

/// Most blocks per (peer, role). Each role of each peer gets at most this many; the kernel has
/// `(2 W - 1)` roles, which must all be resident at once.
pub const MAX_BLOCKS_PER_PEER: u32 = 32;

/// Own-chunk bytes per block of the own chunk's role, by default (see [`coll_shape`]). The
/// own chunk is a local copy, about 15 GB/s per SM on H200, while a peer's chunk moves at
/// 3-6 GB/s per sending SM, so the own chunk needs fewer blocks than a peer.
pub const SELF_BLOCK_BYTES: u64 = 128 << 10;

/// Environment variable: own-chunk KiB per block of the own chunk's role instead of
/// [`SELF_BLOCK_BYTES`] (experiments; every rank must set the same value). `0` gives the own
/// chunk as many blocks as a peer, as before this knob existed.
pub const SELF_BLOCK_ENV: &str = "DEVCOMM_COLL_SELF_BLOCK_KIB";

fn self_block_bytes() -> u64 {
    // Read once: every launch of the process must use the same shape rule.
    static V: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::env::var(SELF_BLOCK_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map_or(SELF_BLOCK_BYTES, |k| k << 10)
    })
}

/// Environment variable: `0` keeps the full grid for small all-to-alls (see
/// [`fit_low_latency`]; experiments, every rank must set the same value).
pub const FIT_GRID_ENV: &str = "DEVCOMM_COLL_FIT_GRID";

fn fit_grid() -> bool {
    static V: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *V.get_or_init(|| std::env::var(FIT_GRID_ENV).map_or(true, |v| v.trim() != "0"))
}

/// Wire bytes per (peer, direction) up to which the kernel moves LL lines, one block per
/// [`LL_BLOCK_BYTES`] (`DC_COLL_LL_MAX` and `THREADS x 16` in `collective.cuh`).
pub const LL_MAX_BYTES: u64 = 128 << 10;
/// Wire bytes one block moves as LL lines.
pub const LL_BLOCK_BYTES: u64 = THREADS as u64 * 16;

/// `shape` with no more blocks per peer than a transfer of `peer_wire` bytes (every peer's, in
/// each direction, equal on every rank) uses when it goes as LL lines: the kernel's plan gives
/// such a transfer one block per [`LL_BLOCK_BYTES`], so the other blocks of each peer role would
/// only start and exit. At 1 KiB per peer on 4 ranks the grid is then 7 blocks instead of
/// 127. Larger transfers (LL128, bulk) keep the shape. The plan takes the smaller of its own
/// count and the blocks per peer, so a lower value where the device constants differ stays
/// correct, as long as every rank computes the same shape.
pub fn fit_low_latency(shape: CollShape, peer_wire: Option<u64>) -> CollShape {
    match peer_wire {
        Some(w) if w <= LL_MAX_BYTES => CollShape {
            per_peer: shape.per_peer.min(w.div_ceil(LL_BLOCK_BYTES).max(1) as u32),
            ..shape
        },
        _ => shape,
    }
}

/// Blocks of the collective kernel: `per_peer` for each of the `2 (W - 1)` peer roles (a sender
/// and a receiver per peer) and `self_blocks` for the own chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollShape {
    /// Blocks of each peer role.
    pub per_peer: u32,
    /// Blocks of the own chunk's role.
    pub self_blocks: u32,
}

impl CollShape {
    /// The grid: every block, all of which must be resident at once.
    pub fn grid(&self, world: usize) -> u32 {
        2 * (world.max(1) as u32 - 1) * self.per_peer + self.self_blocks
    }
}

/// The collective kernel's shape on GPUs of `sm_count` SMs (one block per SM), for `world`
/// ranks and a p2p window of `max_blocks` blocks per peer. Every role gets an even share,
/// `sm_count / (2 W - 1)` blocks (at most [`MAX_BLOCKS_PER_PEER`] and `max_blocks`), unless
/// the own chunk's input size is known (`self_bytes`, not with device counts) and
/// `self_block_bytes` is not 0: then the own chunk gets one block per `self_block_bytes` (at
/// least 1, at most the share), and when that is fewer than the share the peers split the SMs
/// it leaves. Every rank computes the same shape from the same arguments.
pub fn coll_shape(
    sm_count: u32,
    world: usize,
    max_blocks: u32,
    self_bytes: Option<u64>,
    self_block_bytes: u64,
) -> CollShape {
    let world = world.max(1) as u32;
    let cap = |b: u32| b.min(MAX_BLOCKS_PER_PEER).min(max_blocks).max(1);
    let even = cap(sm_count / (2 * world - 1));
    let self_blocks = match self_bytes {
        Some(bytes) if self_block_bytes > 0 && world > 1 => {
            (bytes.div_ceil(self_block_bytes).max(1)).min(even as u64) as u32
        }
        _ => even,
    };
    // The SMs a small own chunk leaves go to the peers; otherwise every role keeps the even
    // share (giving a large own chunk the few SMs left over measured no faster: PERFORMANCE c10).
    let per_peer = if self_blocks < even {
        cap(sm_count.saturating_sub(self_blocks) / (2 * (world - 1)))
    } else {
        even
    };
    CollShape {
        per_peer,
        self_blocks,
    }
}

/// A pair of hooks, `produce(ctx) -> tile` and `consume(ctx, tile)`, given as CUDA C++ source
/// (see `cuda/devcomm/hooks.cuh` for the contract and the `Ctx` struct). The JIT compiles the
/// source into the collective kernel; a compile error comes back as [`Error::Compile`] with
/// NVRTC's message.
///
/// ```text
/// struct Scale2 {
///   using In = float; using Out = float; using Wire = float;
///   static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {
///     auto t = devcomm::load_tile<float>(c);
///     for (float& x : t.v) x *= 2.0f;
///     return t;
///   }
///   static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {
///     devcomm::store_tile<float>(c, t);
///   }
/// };
/// ```
#[derive(Debug, Clone)]
pub struct Hooks {
    name: Cow<'static, str>,
    source: Cow<'static, str>,
    in_size: usize,
    out_size: usize,
    /// Hash of everything above: the key of the loaded-kernel cache (no copy per launch).
    key: u64,
}

/// The copy hooks by element size, 1 to 16 bytes (index: log2 of the size).
const COPY_HOOKS: [&str; 5] = [
    "devcomm::CopyHooks<devcomm::Bytes1>",
    "devcomm::CopyHooks<devcomm::Bytes2>",
    "devcomm::CopyHooks<devcomm::Bytes4>",
    "devcomm::CopyHooks<devcomm::Bytes8>",
    "devcomm::CopyHooks<devcomm::Bytes16>",
];

impl Hooks {
    fn build(
        name: Cow<'static, str>,
        source: Cow<'static, str>,
        in_size: usize,
        out_size: usize,
    ) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&name, &source, in_size, out_size).hash(&mut h);
        Self {
            name,
            source,
            in_size,
            out_size,
            key: h.finish(),
        }
    }

    /// The default hooks: copy elements of `T` (whose size must divide 16).
    pub fn copy<T>() -> Result<Self> {
        let size = std::mem::size_of::<T>();
        if !matches!(size, 1 | 2 | 4 | 8 | 16) {
            return Err(Error::InvalidArgument {
                op: "Hooks::copy",
                reason: format!(
                    "element size {size} does not divide 16; use a byte view of the buffer"
                ),
            });
        }
        let name = COPY_HOOKS[size.trailing_zeros() as usize];
        Ok(Self::build(name.into(), "".into(), size, size))
    }

    /// Whether these are the built-in copy hooks ([`Hooks::copy`]): the wire carries the
    /// input's bytes.
    pub(crate) fn is_copy(&self) -> bool {
        self.source.is_empty()
    }

    /// User hooks: `name` is the struct defined in `source`, whose `In` and `Out` types must be
    /// as large as `I` and `O` (checked when the kernel compiles).
    pub fn new<I, O>(name: impl Into<String>, source: impl Into<String>) -> Self {
        Self::build(
            Cow::Owned(name.into()),
            Cow::Owned(source.into()),
            std::mem::size_of::<I>(),
            std::mem::size_of::<O>(),
        )
    }

    /// Checks that these hooks were declared for the buffers' element sizes (`None`: that
    /// side is not used by the call).
    pub(crate) fn check_sizes(
        &self,
        op: &'static str,
        input: Option<usize>,
        output: Option<usize>,
    ) -> Result<()> {
        let fits = |want: Option<usize>, have: usize| want.is_none_or(|w| w == have);
        if fits(input, self.in_size) && fits(output, self.out_size) {
            return Ok(());
        }
        Err(Error::InvalidArgument {
            op,
            reason: format!(
                "hooks `{}` were declared for elements of {} and {} bytes, the buffers' are \
                 {input:?} and {output:?}",
                self.name, self.in_size, self.out_size
            ),
        })
    }

    /// The hooks struct's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The hooks' CUDA C++ source (empty for the built-in copy hooks).
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// Hash of name, source and sizes: the key of loaded-kernel caches.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    fn expression(&self, mixed: bool) -> String {
        format!(
            "devcomm::coll::coll_kernel<{}, {THREADS}, {mixed}>",
            self.name
        )
    }

    /// The kernel spec: the collective header, the user's source, checks of the element sizes,
    /// and both instantiations (uniform and mixed peer tuning).
    pub fn spec(&self) -> KernelSpec {
        let source = format!(
            "#include \"devcomm/collective.cuh\"\n#line 1 \"hooks.cu\"\n{src}\n#line 1 \"devcomm-checks\"\n\
             static_assert(sizeof({name}::In) == {i}, \"the hooks' In type is not the size of the \
             send buffer's elements ({i} bytes)\");\n\
             static_assert(sizeof({name}::Out) == {o}, \"the hooks' Out type is not the size of the \
             receive buffer's elements ({o} bytes)\");\n",
            src = self.source,
            name = self.name,
            i = self.in_size,
            o = self.out_size,
        );
        let mut spec = KernelSpec::new("collective", source)
            .name_expression(self.expression(false))
            .name_expression(self.expression(true));
        spec.options.extend(options_from_env().iter().cloned());
        spec
    }
}

/// `DEVCOMM_COLL_OPTIONS`: extra NVRTC options for the collective kernel, split at whitespace,
/// e.g. `-DDC_COLL_SELF_ILP=1`, to try other values of its tuning constants (the `DC_COLL_*`
/// macros of `cuda/devcomm/collective.cuh`, docs/TUNING.md). For experiments: every rank must
/// set the same, since both ends of a transfer derive their plan from these constants. They
/// are part of the kernel cache's key.
pub const OPTIONS_ENV: &str = "DEVCOMM_COLL_OPTIONS";

fn options_from_env() -> &'static [String] {
    static OPTIONS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    OPTIONS.get_or_init(|| crate::jit::env_options(OPTIONS_ENV))
}

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
}

/// Per-communicator collective state.
#[derive(Debug)]
pub(crate) struct Collective {
    /// `u64[4]`: variable calls done, arrivals, overflow flag, spare.
    _state: CudaSlice<u64>,
    state_ptr: u64,
    /// The smallest SM count of the group (all ranks use the same blocks per peer).
    sm_count: u32,
    /// Loaded kernels by (hooks key, mixed tuning), with their resident blocks per SM.
    functions: Mutex<HashMap<(u64, bool), LoadedKernel>>,
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
            .filter(|_| uniform_copy && fit_grid())
            .map(|b| b.div_ceil(16) * 16);
        let shape = coll_shape(
            self.sm_count,
            world,
            max_blocks,
            self_bytes,
            self_block_bytes(),
        );
        fit_low_latency(shape, peer_wire)
    }

    fn function(
        &self,
        group: &Group,
        jit: &Jit,
        hooks: &Hooks,
        mixed: bool,
    ) -> Result<LoadedKernel> {
        let poisoned = || Error::Aborted {
            rank: group.rank as i32,
            reason: "a thread panicked while loading kernels".into(),
        };
        let key = (hooks.key, mixed);
        if let Some(f) = self.functions.lock().map_err(|_| poisoned())?.get(&key) {
            return Ok(f.clone());
        }
        let module = jit.load(&group.ctx, &hooks.spec())?;
        let f = module.function(&hooks.expression(mixed))?;
        let per_sm = f
            .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
            .cuda(
                group.rank as i32,
                "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            )?;
        let gate = KernelGate::new(
            format!("collective-{:016x}-{mixed}", hooks.key),
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
    pub(crate) fn launch(
        &self,
        group: &Group,
        jit: &Jit,
        p2p: &P2P,
        hooks: &Hooks,
        call: CollCall,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        group.errors.check()?;
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
        let mut net_peers = 0u32;
        for p in 0..world {
            match group.topology.kind(p) {
                LinkKind::SelfLink | LinkKind::Nvl => {}
                other => {
                    return Err(Error::NoPath {
                        op: call.op,
                        rank,
                        peer: p,
                        kind: other.to_string(),
                    })
                }
            }
            if p != rank && group.topology.tuned_as_net(p) {
                net_peers |= 1 << p;
            }
        }
        p2p.bind(group, stream)?;
        let mixed = net_peers != 0;
        let (func, per_sm, gate) = self.function(group, jit, hooks, mixed)?;
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
            reserved: 0,
        };
        let cfg = linear_launch(grid, THREADS);
        // SAFETY: coll_kernel<H, THREADS, MIXED>(CollLaunch) takes exactly this struct by
        // value and enters through enter_after_previous_kernel. Its window and counters live as long as the communicator; the buffers and
        // count arrays were checked by the caller (sizes from cudarc slices); the kernel reads
        // at most `send_capacity` rows of `input` and writes at most `recv_capacity` rows of
        // `output` (device counts beyond them are refused on the device), and every grid block
        // is resident (checked above), so the roles' waits on each other cannot deadlock.
        unsafe { crate::cuda::launch_struct(stream, &func, cfg, &args, group.pdl) }
            .cuda(rank as i32, "cuLaunchKernelEx (collective)")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_latency_transfers_get_only_the_blocks_their_plan_uses() {
        let full = coll_shape(132, 4, 32, Some(1024), SELF_BLOCK_BYTES);
        // 1 KiB per peer: one block per peer role and one for the own chunk.
        let small = fit_low_latency(full, Some(1024));
        assert_eq!((small.per_peer, small.self_blocks), (1, 1));
        assert_eq!(small.grid(4), 7);
        // 64 KiB: 8 blocks of 8 KiB; the largest LL size: 16.
        assert_eq!(fit_low_latency(full, Some(64 << 10)).per_peer, 8);
        assert_eq!(fit_low_latency(full, Some(LL_MAX_BYTES)).per_peer, 16);
        // LL128 and bulk sizes, unknown sizes: the shape as it was.
        assert_eq!(fit_low_latency(full, Some(LL_MAX_BYTES + 16)), full);
        assert_eq!(fit_low_latency(full, None), full);
        // Never more than the shape had, never 0.
        let narrow = coll_shape(16, 8, 32, None, SELF_BLOCK_BYTES);
        assert_eq!(
            fit_low_latency(narrow, Some(64 << 10)).per_peer,
            narrow.per_peer
        );
        assert_eq!(fit_low_latency(full, Some(0)).per_peer, 1);
    }

    #[test]
    fn every_role_gets_an_even_share_without_a_known_own_chunk() {
        // 132 SMs, 4 ranks: 7 roles of 18 blocks (device counts, or the knob set to 0).
        let even = CollShape {
            per_peer: 18,
            self_blocks: 18,
        };
        assert_eq!(coll_shape(132, 4, 32, None, SELF_BLOCK_BYTES), even);
        assert_eq!(coll_shape(132, 4, 32, Some(1 << 20), 0), even);
        assert_eq!(even.grid(4), 126);
        // One rank: only the own chunk.
        let one = coll_shape(132, 1, 32, Some(1 << 20), SELF_BLOCK_BYTES);
        assert_eq!(one.grid(1), one.self_blocks);
    }

    #[test]
    fn a_small_own_chunk_leaves_its_blocks_to_the_peers() {
        let s = coll_shape(132, 4, 32, Some(1 << 20), SELF_BLOCK_BYTES);
        assert_eq!((s.self_blocks, s.per_peer, s.grid(4)), (8, 20, 128));
        // At least one block for an empty own chunk; at most the even share for a large one.
        let s = coll_shape(132, 4, 32, Some(0), SELF_BLOCK_BYTES);
        assert_eq!((s.self_blocks, s.per_peer), (1, 21));
        let s = coll_shape(132, 4, 32, Some(1 << 30), SELF_BLOCK_BYTES);
        assert_eq!((s.self_blocks, s.per_peer), (18, 18));
    }

    #[test]
    fn shapes_fit_the_gpu_and_the_window() {
        for sm in [1u32, 7, 16, 78, 132, 144] {
            for world in 1..=8usize {
                for max_blocks in [1u32, 4, 16, 32] {
                    for self_bytes in [None, Some(0), Some(1 << 16), Some(1 << 20), Some(1 << 28)] {
                        let s = coll_shape(sm, world, max_blocks, self_bytes, SELF_BLOCK_BYTES);
                        assert!(s.per_peer >= 1 && s.self_blocks >= 1);
                        assert!(s.per_peer <= max_blocks.min(MAX_BLOCKS_PER_PEER));
                        let roles = 2 * world as u32 - 1;
                        // Every block resident whenever one block per role fits.
                        if sm >= roles {
                            assert!(
                                s.grid(world) <= sm,
                                "{sm} {world} {max_blocks} {self_bytes:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}
