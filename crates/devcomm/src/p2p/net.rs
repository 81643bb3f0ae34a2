//! The send/recv family's network transport (docs/NETWORK.md, "Send/recv over the network"):
//! the transport, its host-mapped queues and staging, the launch of the network send/recv
//! kernel, and the routed send/recv ([`P2P::sendrecv`]). Built only when the mesh says some
//! link of the job is `Net`: NVLink-only jobs never load UCX.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::{KernelKey, Transfer, NET_THREADS, P2P};
use crate::cuda::{launch_struct, linear_launch, HostMapped};
use crate::error::{CudaResultExt, Error, Result};
use crate::group::Group;
use crate::jit::Jit;
use crate::mesh::P2PRoute;
use crate::net::queue::queue_bytes;
use crate::net::route::{self, NetP2PLaunch, StagingLayout};
use crate::net::{ErrorSink, NetConfig, NetTransport, QueueMemory};

/// The network side of a communicator. Field order is drop order: the transport (its proxy
/// reads the queues and staging) goes before the memory.
pub(crate) struct NetPeers {
    transport: Option<NetTransport>,
    key: u32,
    /// Queue channels of users' kernels, after the routes' (`route::CHANNELS`).
    user_channels: u32,
    layout: StagingLayout,
    handle: crate::net::NetQueuesHandle,
    /// Owns the memory `counters_base` points into.
    _counters: CudaSlice<u64>,
    counters_base: u64,
    staging: HostMapped,
    _queues: HostMapped,
    /// The stream of a split call's network role (made on first use).
    side: std::sync::OnceLock<Arc<CudaStream>>,
    group: Arc<Group>,
}

impl std::fmt::Debug for NetPeers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetPeers")
            .field("transport", &self.transport)
            .field("layout", &self.layout)
            .finish()
    }
}

impl NetPeers {
    /// Collective: `None` on every rank when no link of the job is `Net`; otherwise the
    /// transport to this rank's network peers (possibly none: every rank takes part in the
    /// transport's setup) with the staging registered.
    pub(crate) fn new(group: &Arc<Group>) -> Result<Option<Self>> {
        let rank = group.rank;
        let world = group.world_size;
        let net_peers = group.mesh.network_peers();
        if !group.mesh.network_in_job() {
            return Ok(None);
        }
        let config = &group.config;
        let slot_bytes = u64::from(config.net_slot_kib) * 1024;
        let capacity = config.net_queue_capacity;
        let channels = route::CHANNELS + config.net_user_channels;
        let local = (|| {
            let layout = StagingLayout::new(world, config.net_slots, slot_bytes)?;
            let total = layout.total().expect("checked by StagingLayout::new");
            let qbytes = queue_bytes(world as u32, channels, capacity)?;
            let queues = HostMapped::new(&group.ctx, qbytes)?;
            let staging = HostMapped::new(&group.ctx, total as usize)?;
            let counters = group
                .ctx
                .default_stream()
                .alloc_zeros::<u64>(4 * world)
                .cuda(rank as i32, "cuMemAlloc (network counters)")?;
            group
                .ctx
                .default_stream()
                .synchronize()
                .cuda(rank as i32, "cuStreamSynchronize")?;
            Ok((layout, queues, staging, counters))
        })()
        .map_err(|e: Error| crate::cuda::with_rank(e, rank));
        let (layout, queues, staging, counters) = group.agree("network staging", local)?;
        // SAFETY: the queue memory is 128-byte aligned (page-aligned), `qbytes` long, and lives
        // in `self` after the transport (dropped first).
        let qm = unsafe {
            QueueMemory::borrowed(
                queues.host_ptr(),
                queues.len(),
                queues.device_ptr(),
                world as u32,
                channels,
                capacity,
            )
        };
        // SAFETY: the error state lives in `group`, which `self` keeps alive beyond the
        // transport.
        let sink = unsafe { ErrorSink::new(group.errors.host_ptr()) };
        let net_config = NetConfig {
            channels,
            ..NetConfig::from_config(config)
        };
        // SAFETY: as above: the sink's state outlives the transport.
        let transport =
            unsafe { NetTransport::with_queues(&group.store, &net_peers, sink, net_config, qm) }?;
        let total = layout.total().expect("checked");
        let user_channels = config.net_user_channels;
        // SAFETY: the staging stays allocated until `self` drops, after the transport.
        let key =
            unsafe { transport.register(&group.store, staging.host_ptr() as u64, total, false) }?;
        let handle =
            transport
                .queues()
                .handle(rank as u32, group.errors.device_ptr(), group.device_timeout);
        let counters_base = {
            let stream = group.ctx.default_stream();
            let (p, _sync) = counters.device_ptr(&stream);
            p
        };
        log::info!(
            "rank {rank}: network peers {net_peers:?} over UCX {:?}",
            transport.library()
        );
        Ok(Some(Self {
            transport: Some(transport),
            key,
            user_channels,
            layout,
            handle,
            _counters: counters,
            counters_base,
            staging,
            _queues: queues,
            side: std::sync::OnceLock::new(),
            group: group.clone(),
        }))
    }

    /// The transport (present until the communicator tears it down).
    pub(crate) fn transport(&self) -> Result<&NetTransport> {
        self.transport.as_ref().ok_or_else(|| Error::Network {
            rank: self.group.rank as i32,
            peer: -1,
            message: format!(
                "rank {}: the network transport is shut down",
                self.group.rank
            ),
        })
    }

    /// The communicator's group.
    pub(crate) fn group(&self) -> &Arc<Group> {
        &self.group
    }

    /// The queues as kernels receive them.
    pub(crate) fn queues_handle(&self) -> crate::net::NetQueuesHandle {
        self.handle
    }

    /// Queue channels of users' kernels per peer.
    pub(crate) fn user_channels(&self) -> u32 {
        self.user_channels
    }

    /// The kernel argument for the roles (each non-empty, with a network peer).
    fn launch_args(&self, send: Option<Transfer>, recv: Option<Transfer>) -> NetP2PLaunch {
        NetP2PLaunch {
            q: self.handle,
            staging: self.staging.device_ptr(),
            counters: self.counters_base,
            slot_bytes: self.layout.slot_bytes,
            slots: self.layout.slots as u32,
            key: self.key,
            send_buf: send.map_or(0, |t| t.ptr),
            send_bytes: send.map_or(0, |t| t.bytes),
            recv_buf: recv.map_or(0, |t| t.ptr),
            recv_bytes: recv.map_or(0, |t| t.bytes),
            send_peer: send.map_or(-1, |t| t.peer as i32),
            recv_peer: recv.map_or(-1, |t| t.peer as i32),
        }
    }

    /// The staging and queues for the collectives' network roles (no send/recv role).
    pub(crate) fn coll_args(&self) -> NetP2PLaunch {
        self.launch_args(None, None)
    }

    /// Launches the network send/recv kernel for the roles (the route chose the network for
    /// every non-empty one). Explicit launch knobs (`Transfer::config`) are for the NVLink
    /// protocols and are not used here. No host synchronisation: graph-capturable.
    pub(crate) fn launch(
        &self,
        p2p: &P2P,
        jit: &Jit,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        self.group.errors.check_before_launch()?;
        p2p.bind(&self.group, stream)?;
        self.launch_on(p2p, jit, send, recv, stream)
    }

    /// A call whose two roles take different routes (`P2PRoute::Split`, or a
    /// `sendrecv_registered` with one NVLink and one network peer): the NVLink role, which
    /// `nvlink` enqueues on the stream it is given (the caller's), and the network role beside
    /// it on this communicator's side stream, which starts after `stream`'s earlier work and
    /// which `stream` waits for at the end (an event fork and join: graph-capturable, and both
    /// roles run at once, so neither waits for a peer that waits for the other). The network
    /// kernel is resolved first and nothing is launched when the NVLink role is refused.
    pub(crate) fn launch_split(
        &self,
        p2p: &P2P,
        jit: &Jit,
        network: [Option<Transfer>; 2],
        nvlink: impl FnOnce(&Arc<CudaStream>) -> Result<()>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let group = &self.group;
        let rank = group.rank as i32;
        group.errors.check_before_launch()?;
        // Loaded (and the network peers' loads awaited) before the NVLink role launches, so
        // that a failure here leaves no role of this call waiting on its peer.
        let peer = |t: Option<Transfer>| t.filter(|t| t.bytes > 0).map_or(-1, |t| t.peer as i32);
        p2p.ready(group, jit, network.map(peer))?;
        p2p.function(group, jit, KernelKey::Net)?;
        let side = match self.side.get() {
            Some(s) => s.clone(),
            None => {
                let s = group.ctx.new_stream().cuda(rank, "cuStreamCreate")?;
                self.side.get_or_init(|| s).clone()
            }
        };
        let before = stream
            .record_event(None)
            .cuda(rank, "cuEventRecord (split send/recv)")?;
        nvlink(stream)?;
        side.wait(&before)
            .cuda(rank, "cuStreamWaitEvent (split send/recv)")?;
        let launched = self.launch_on(p2p, jit, network[0], network[1], &side);
        // Joined whatever happened: the caller's stream never runs ahead of the side stream.
        stream
            .join(&side)
            .cuda(rank, "cuStreamWaitEvent (split send/recv)")?;
        launched
    }

    /// The network kernel on `on` (the caller's stream, already bound, or the side stream).
    fn launch_on(
        &self,
        p2p: &P2P,
        jit: &Jit,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        on: &Arc<CudaStream>,
    ) -> Result<()> {
        let group = &self.group;
        let send = send.filter(|t| t.bytes > 0);
        let recv = recv.filter(|t| t.bytes > 0);
        let roles = u32::from(send.is_some()) + u32::from(recv.is_some());
        if roles == 0 {
            return Ok(());
        }
        let peer = |t: Option<Transfer>| t.map_or(-1, |t| t.peer as i32);
        p2p.ready(group, jit, [peer(send), peer(recv)])?;
        let func = p2p.function(group, jit, KernelKey::Net)?;
        let args = self.launch_args(send, recv);
        // SAFETY: p2p_net_kernel<NET_THREADS>(NetP2PLaunch) takes exactly this struct by value
        // and enters through enter_after_previous_kernel. It writes the caller's destination
        // (`recv_bytes`, sized by the caller), this rank's staging and queues (alive as long
        // as `self`; every offset is inside StagingLayout::total for the peers, which the route
        // checked are ranks) and the counters; it reads the caller's source.
        unsafe {
            launch_struct(
                on,
                &func,
                linear_launch(roles, NET_THREADS),
                &args,
                group.pdl,
            )
        }
        .cuda(
            group.rank as i32,
            "cuLaunchKernelEx (sendrecv over the network)",
        )?;
        Ok(())
    }
}

impl Drop for NetPeers {
    fn drop(&mut self) {
        // Kernels using the staging end first (every wait in them is bounded).
        if let Err(e) = self.group.ctx.synchronize() {
            log::warn!(
                "rank {}: synchronising before the network tear-down: {e}",
                self.group.rank
            );
        }
        let Some(transport) = self.transport.take() else {
            return;
        };
        if self.group.errors.is_aborted() {
            return; // dropped: endpoints closed by force (a peer may be dead)
        }
        let group = &self.group;
        let done = transport.shutdown_by(|tag| {
            group
                .teardown_barrier(tag)
                .map_err(|e| crate::net::NetError::InvalidArgument {
                    op: "network tear-down",
                    reason: e.to_string(),
                })
        });
        if let Err(e) = done {
            log::warn!("rank {}: network tear-down: {e}", group.rank);
        }
    }
}

/// The route of a send/recv call: the mesh's decision.
fn route_of(group: &Group, send: Option<Transfer>, recv: Option<Transfer>) -> Result<P2PRoute> {
    let role = |t: Transfer| (t.peer, t.bytes);
    group.mesh.p2p_route(send.map(role), recv.map(role))
}

impl P2P {
    /// The network transport, which a job with a network link has on every rank (`None` in
    /// an NVLink-only job).
    pub(crate) fn network(&self) -> Option<&NetPeers> {
        self.net.as_ref()
    }

    /// [`P2P::network`] for a call of `op` that the mesh routed to the network.
    pub(crate) fn network_for(&self, op: &'static str, rank: usize) -> Result<&NetPeers> {
        self.net.as_ref().ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!(
                "rank {rank}: a network peer without a network transport (internal error)"
            ),
        })
    }

    /// The network transport's arguments of the collective kernel (`None`: no network links).
    pub(crate) fn coll_net_args(&self) -> Option<NetP2PLaunch> {
        self.net.as_ref().map(NetPeers::coll_args)
    }

    /// Send/recv through the route the mesh chooses: the NVLink kernels, the network kernel
    /// when every role with bytes has a network peer, or both side by side when the two
    /// roles need one each. The caller checked that the roles' buffers do not overlap.
    pub(crate) fn sendrecv(
        &self,
        group: &Group,
        jit: &Jit,
        send: Option<Transfer>,
        recv: Option<Transfer>,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        match route_of(group, send, recv)? {
            P2PRoute::Nvlink => {
                // An empty role with a network peer moves nothing: the NVLink path would refuse
                // its peer.
                let is_net = |t: &Transfer| group.mesh.is_network(t.peer);
                let keep = |t: Option<Transfer>| t.filter(|t| !(t.bytes == 0 && is_net(t)));
                self.launch(group, jit, keep(send), keep(recv), stream)
            }
            P2PRoute::Network => self
                .network_for("sendrecv", group.rank)?
                .launch(self, jit, send, recv, stream),
            P2PRoute::Split { send_by_network } => {
                let (network, nvlink) = match send_by_network {
                    true => ([send, None], [None, recv]),
                    false => ([None, recv], [send, None]),
                };
                self.network_for("sendrecv", group.rank)?.launch_split(
                    self,
                    jit,
                    network,
                    |s| self.launch(group, jit, nvlink[0], nvlink[1], s),
                    stream,
                )
            }
        }
    }
}
