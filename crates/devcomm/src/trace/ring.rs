//! The trace ring's layout, shared with `cuda/devcomm/trace.cuh` (`TraceRing`, `TraceEvent`),
//! its decoding, and [`claim`]: the writers' claim rule, the same on the host as in the
//! kernels' `trace_record`, so that the CPU tests exercise what the kernels do.

use std::mem::{offset_of, size_of};

/// One event as the kernels write it (`devcomm::TraceEvent`, 32 bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RawEvent {
    /// `%globaltimer` when it was recorded.
    pub time_ns: u64,
    /// Bytes moved (phase ends, [`Kind::Bytes`]), or the kind's argument.
    pub arg: u64,
    /// The host's call id ([`RingHeader::call`] when it was recorded).
    pub call: u32,
    /// [`Kind`] as a number.
    pub kind: u16,
    /// [`Phase`] as a number.
    pub phase: u16,
    /// `blockIdx.x`.
    pub block: u16,
    /// The peer rank, or [`NO_PEER`].
    pub peer: u16,
    /// The slot or step waited on (waits), else 0.
    pub slot: u32,
}

/// The ring's header (`devcomm::TraceRing`, 64 bytes); the events follow.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RingHeader {
    /// Records claimed so far; may exceed `capacity` (the excess was dropped).
    pub claimed: u64,
    /// Records that fit.
    pub capacity: u64,
    /// Id of the current call, written in stream order before its kernels.
    pub call: u32,
    /// The communicator's rank.
    pub rank: u32,
    /// Zero.
    pub reserved: [u64; 5],
}

/// Bytes of the header (`kTraceHeaderBytes`).
pub const HEADER_BYTES: usize = 64;
/// The peer of an event that has none (`kTraceNoPeer`).
pub const NO_PEER: u16 = 0xffff;

const _: () = assert!(size_of::<RawEvent>() == 32);
const _: () = assert!(size_of::<RingHeader>() == HEADER_BYTES);

/// Event kinds (`TraceKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// A block starts.
    KernelBegin = 1,
    /// A block ends.
    KernelEnd = 2,
    /// A phase starts.
    PhaseBegin = 3,
    /// A phase ends (with the bytes it moved).
    PhaseEnd = 4,
    /// A wait for a peer starts.
    WaitBegin = 5,
    /// The wait is over.
    WaitEnd = 6,
    /// An instant: bytes moved.
    Bytes = 7,
}

impl Kind {
    /// The kind numbered `n`, if any.
    pub fn from_u16(n: u16) -> Option<Self> {
        Some(match n {
            1 => Self::KernelBegin,
            2 => Self::KernelEnd,
            3 => Self::PhaseBegin,
            4 => Self::PhaseEnd,
            5 => Self::WaitBegin,
            6 => Self::WaitEnd,
            7 => Self::Bytes,
            _ => return None,
        })
    }
}

/// Phases (`TracePhase`): their names in traces and summaries, indexed by number.
pub const PHASES: &[&str] = &[
    "kernel",
    "stage",
    "wait",
    "reduce",
    "write out",
    "send",
    "recv",
    "agree",
];

/// The name of phase `n` (`phase N` for a number this build does not know).
pub fn phase_name(n: u16) -> String {
    PHASES
        .get(n as usize)
        .map_or_else(|| format!("phase {n}"), |s| (*s).to_owned())
}

/// The outcome of one writer's claim on a ring of `capacity` records whose `claimed` counter
/// was `before`: the index to write, or `None` (dropped: counted by `claimed` alone).
pub fn claim(before: u64, capacity: u64) -> Option<u64> {
    (before < capacity).then_some(before)
}

/// Records dropped by a ring whose counter reached `claimed`.
pub fn dropped(claimed: u64, capacity: u64) -> u64 {
    claimed.saturating_sub(capacity)
}

/// The events of a ring image (header, then records), as many as were written and fit.
/// A record whose kind is 0 was claimed but not (yet) written: a block that was stopped in
/// the middle of `trace_record`; it is skipped.
pub fn decode(image: &[u8]) -> (RingHeader, Vec<RawEvent>) {
    let mut header = RingHeader::default();
    if image.len() < HEADER_BYTES {
        return (header, Vec::new());
    }
    let word = |at: usize| u64::from_le_bytes(image[at..at + 8].try_into().expect("8 bytes"));
    header.claimed = word(0);
    header.capacity = word(8);
    header.call = word(16) as u32;
    header.rank = (word(16) >> 32) as u32;
    let room = ((image.len() - HEADER_BYTES) / size_of::<RawEvent>()) as u64;
    let n = header.claimed.min(header.capacity).min(room) as usize;
    let events = image[HEADER_BYTES..HEADER_BYTES + n * size_of::<RawEvent>()]
        .chunks_exact(size_of::<RawEvent>())
        .map(decode_event)
        .filter(|e| e.kind != 0)
        .collect();
    (header, events)
}

/// One record's 32 bytes (little-endian, the kernels' layout) as an event.
pub fn decode_event(bytes: &[u8]) -> RawEvent {
    let w = |k: usize| u64::from_le_bytes(bytes[8 * k..8 * k + 8].try_into().expect("8 bytes"));
    let (a, b) = (w(2), w(3));
    RawEvent {
        time_ns: w(0),
        arg: w(1),
        call: a as u32,
        kind: (a >> 32) as u16,
        phase: (a >> 48) as u16,
        block: b as u16,
        peer: (b >> 16) as u16,
        slot: (b >> 32) as u32,
    }
}

/// The event's record as the kernels lay it out: four little-endian words.
pub fn encode_event(e: &RawEvent) -> [u64; 4] {
    [
        e.time_ns,
        e.arg,
        e.call as u64 | (e.kind as u64) << 32 | (e.phase as u64) << 48,
        e.block as u64 | (e.peer as u64) << 16 | (e.slot as u64) << 32,
    ]
}

/// Field offsets as `(struct, field, offset, size_of struct)`, for the layout test.
pub const LAYOUT: &[(&str, &str, usize, usize)] = &[
    (
        "TraceEvent",
        "time_ns",
        offset_of!(RawEvent, time_ns),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "arg",
        offset_of!(RawEvent, arg),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "call",
        offset_of!(RawEvent, call),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "kind",
        offset_of!(RawEvent, kind),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "phase",
        offset_of!(RawEvent, phase),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "block",
        offset_of!(RawEvent, block),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "peer",
        offset_of!(RawEvent, peer),
        size_of::<RawEvent>(),
    ),
    (
        "TraceEvent",
        "slot",
        offset_of!(RawEvent, slot),
        size_of::<RawEvent>(),
    ),
    (
        "TraceRing",
        "claimed",
        offset_of!(RingHeader, claimed),
        size_of::<RingHeader>(),
    ),
    (
        "TraceRing",
        "capacity",
        offset_of!(RingHeader, capacity),
        size_of::<RingHeader>(),
    ),
    (
        "TraceRing",
        "call",
        offset_of!(RingHeader, call),
        size_of::<RingHeader>(),
    ),
    (
        "TraceRing",
        "rank",
        offset_of!(RingHeader, rank),
        size_of::<RingHeader>(),
    ),
    (
        "TraceRing",
        "reserved",
        offset_of!(RingHeader, reserved),
        size_of::<RingHeader>(),
    ),
];

/// A host-side writer with the kernels' rule, over a ring image in memory: what the overflow
/// test drives (several threads claiming at once, as blocks do).
#[cfg(test)]
pub(crate) fn write_event(
    image: &[std::sync::atomic::AtomicU64],
    capacity: u64,
    event: RawEvent,
) -> bool {
    use std::sync::atomic::Ordering;
    let before = image[0].fetch_add(1, Ordering::Relaxed);
    let Some(i) = claim(before, capacity) else {
        return false;
    };
    let at = HEADER_BYTES / 8 + 4 * i as usize;
    for (k, v) in encode_event(&event).into_iter().enumerate() {
        image[at + k].store(v, Ordering::Relaxed);
    }
    true
}
