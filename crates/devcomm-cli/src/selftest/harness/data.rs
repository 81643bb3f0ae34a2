//! Shared helpers of the checks: poison and guard bytes, byte comparison, the pairs of the
//! pairwise checks, message sizes, registered `cuMemAlloc` buffers, and small hooks (and a
//! hook's row group width set in its source).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use devcomm::testing::DeviceBuffer;
use devcomm::{RegisteredRange, Registration};

use super::context::Ctx;

/// The byte a destination is filled with before a check writes it: what is still poison
/// afterwards was not written.
pub(crate) const POISON: u8 = 0xA5;

/// Message sizes of the size checks: 1 B to 1 GiB, odd sizes included.
pub(crate) const SIZES: &[usize] = &[
    1,
    7,
    8,
    13,
    4095,
    4099,
    65_536,
    65_537,
    262_147,
    (1 << 20) + 5,
    (8 << 20) + 17,
    64 << 20,
    (256 << 20) + 1,
    1 << 30,
];

/// Partner for pairwise checks: 0<->1, 2<->3, ...; None for an odd last rank.
pub(crate) fn partner(cx: &Ctx) -> Option<usize> {
    let (r, w) = (cx.comm.rank(), cx.comm.world_size());
    let p = r ^ 1;
    (p < w).then_some(p)
}

/// The partner and whether this rank sends and receives: both ways, or even ranks send and odd
/// ranks receive. `None` for an odd last rank.
pub(crate) fn roles(cx: &Ctx, both: bool) -> Option<(usize, bool, bool)> {
    let rank = cx.comm.rank();
    partner(cx).map(|peer| (peer, both || rank % 2 == 0, both || rank % 2 == 1))
}

/// A device buffer of `bytes` poison bytes.
pub(crate) fn poisoned(cx: &Ctx, bytes: usize) -> Result<CudaSlice<u8>, String> {
    cx.stream
        .clone_htod(&vec![POISON; bytes])
        .map_err(|e| e.to_string())
}

/// `Ok` when `got` equals `expect`; otherwise the first differing byte (or the lengths), with
/// `what` in front.
pub(crate) fn compare(got: &[u8], expect: &[u8], what: &str) -> Result<(), String> {
    if got.len() != expect.len() {
        return Err(format!(
            "{what}: {} bytes, expected {}",
            got.len(),
            expect.len()
        ));
    }
    match got.iter().zip(expect).position(|(a, b)| a != b) {
        Some(i) => Err(format!(
            "{what}: byte {i} is {:#x}, expected {:#x}",
            got[i], expect[i]
        )),
        None => Ok(()),
    }
}

/// A `cuMemAlloc` buffer registered with every rank; deregistered and freed on drop.
pub(crate) struct RegBuf<'a> {
    /// Released collectively in `drop` before the memory is freed (`Registration::release`
    /// returns once no peer maps this rank's buffer); `None` only inside `drop`.
    reg: Option<Registration<'a>>,
    /// Freed after the registration above.
    _memory: DeviceBuffer,
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
}

impl<'a> RegBuf<'a> {
    /// Collective.
    pub(crate) fn new(cx: &'a Ctx, bytes: usize) -> Result<Self, String> {
        let ctx = cx.comm.context();
        let memory = DeviceBuffer::zeroed(ctx, bytes).map_err(|e| e.to_string())?;
        // The zeroing runs on the legacy stream: finish it before anything else touches it.
        devcomm::testing::synchronize(ctx).map_err(|e| e.to_string())?;
        let ptr = memory.ptr();
        // SAFETY: `memory` is `bytes` bytes and is freed only after `reg` (the field order
        // above) has been released.
        let reg = unsafe { cx.comm.register(ptr, bytes) }.map_err(|e| e.to_string())?;
        Ok(Self {
            reg: Some(reg),
            _memory: memory,
            ptr,
            bytes,
        })
    }

    /// A cudarc view of the whole buffer (for NCCL). Never dropped: this struct frees it.
    pub(crate) fn view(&self, stream: &Arc<CudaStream>) -> std::mem::ManuallyDrop<CudaSlice<u8>> {
        // SAFETY: `ptr` is a live allocation of `bytes` bytes that outlives the view (the
        // caller holds `self`); ManuallyDrop keeps cudarc from freeing it.
        std::mem::ManuallyDrop::new(unsafe { stream.upgrade_device_ptr(self.ptr, self.bytes) })
    }

    /// The registration.
    pub(crate) fn reg(&self) -> &Registration<'a> {
        self.reg.as_ref().expect("released only in drop")
    }

    /// The registered range of `bytes` at `offset`.
    pub(crate) fn at(&self, offset: usize, bytes: usize) -> RegisteredRange<'_> {
        self.reg().range(offset as u64, bytes as u64)
    }

    /// Fills the whole buffer with [`POISON`] on `stream` (also inside a capture).
    pub(crate) fn poison(&self, stream: &Arc<CudaStream>) -> Result<(), String> {
        // SAFETY: the whole allocation, which this struct owns and frees only after
        // deregistration (which synchronises the device); ordered on the rank's stream.
        unsafe { devcomm::testing::memset_d8_async(self.ptr, POISON, self.bytes, stream) }
            .map_err(|e| e.to_string())
    }
}

impl Drop for RegBuf<'_> {
    fn drop(&mut self) {
        // Collective, so that the memory (freed after this) is mapped by no peer any more.
        if let Some(reg) = self.reg.take() {
            if let Err(e) = reg.release() {
                log::warn!("self-test: releasing a registered buffer: {e}");
            }
        }
    }
}

/// A benchmark's destination of `bytes`: a registered `cuMemAlloc` buffer (the zero-copy
/// benchmarks; NCCL receives into the same one) or an ordinary allocation.
pub(crate) enum BenchDst<'a> {
    /// The buffer and a cudarc view of it, never dropped: the `RegBuf` frees the memory.
    Registered(RegBuf<'a>, std::mem::ManuallyDrop<CudaSlice<u8>>),
    /// An ordinary allocation.
    Owned(CudaSlice<u8>),
}

impl<'a> BenchDst<'a> {
    /// Collective when `registered`.
    pub(crate) fn new(cx: &'a Ctx, bytes: usize, registered: bool) -> Result<Self, String> {
        if registered {
            let r = RegBuf::new(cx, bytes)?;
            let view = r.view(&cx.stream);
            Ok(Self::Registered(r, view))
        } else {
            let b = cx.stream.alloc_zeros(bytes).map_err(|e| e.to_string())?;
            Ok(Self::Owned(b))
        }
    }

    /// The registration (if registered) and the destination as a cudarc slice.
    pub(crate) fn parts(&mut self) -> (Option<&Registration<'a>>, &mut CudaSlice<u8>) {
        match self {
            Self::Registered(r, v) => (Some(r.reg()), v),
            Self::Owned(o) => (None, o),
        }
    }
}

/// A collective hook pair that doubles every value on the way (`produce`), for f32.
pub(crate) fn doubling_hooks() -> devcomm::Hooks<f32> {
    const SOURCE: &str = "struct Double {\n  using In = float; using Out = float; using Wire = float;\n  \
        static __device__ devcomm::Tile<float> produce(const devcomm::Ctx& c) {\n    \
        devcomm::Tile<float> t = devcomm::load_tile<float>(c);\n    \
        for (float& x : t.v) x *= 2.0f;\n    return t;\n  }\n  \
        static __device__ void consume(const devcomm::Ctx& c, const devcomm::Tile<float>& t) {\n    \
        devcomm::store_tile<float>(c, t);\n  }\n};\n";
    devcomm::Hooks::new("Double", SOURCE)
}

/// A hook's source with its one `kRowThreads = N` declaration set to `threads` (one of
/// `devcomm::reduce::rows::ROW_THREADS`): the same hook checked or timed at several row group
/// widths. An error names what is missing.
pub(crate) fn with_row_threads(source: &str, threads: u32) -> Result<String, String> {
    use devcomm::reduce::rows::ROW_THREADS;
    const KEY: &str = "kRowThreads = ";
    if !ROW_THREADS.contains(&threads) {
        return Err(format!(
            "{threads} threads a row: a hook's row group is one of {ROW_THREADS:?}"
        ));
    }
    let mut found = source.match_indices(KEY);
    let at = match (found.next(), found.next()) {
        (Some((i, _)), None) => i + KEY.len(),
        (None, _) => {
            return Err(format!(
                "the hook declares no `{KEY}N;`, so its row group cannot be set to {threads}"
            ))
        }
        (Some(_), Some(_)) => {
            return Err(format!(
                "the hook has `{KEY}` more than once: which one to set to {threads} is unclear"
            ))
        }
    };
    let digits = source[at..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(format!(
            "the hook's `{KEY}` is not followed by a number: cannot set it to {threads}"
        ));
    }
    Ok(format!(
        "{}{threads}{}",
        &source[..at],
        &source[at + digits..]
    ))
}

/// A reduction epilogue that doubles every reduced f32 value of its row.
pub(crate) fn doubling_epilogue() -> devcomm::Hooks<f32> {
    const SOURCE: &str = "struct Twice {\n  using T = float;\n  \
        static __device__ void epilogue(const devcomm::red::RowCtx& c, float* row) {\n    \
        for (unsigned long long j = c.lane; j < c.cols; j += 32) row[j] *= 2.0f;\n  }\n};\n";
    devcomm::Hooks::new("Twice", SOURCE)
}

#[cfg(test)]
mod tests {
    use super::{compare, with_row_threads};

    #[test]
    fn with_row_threads_sets_the_one_declaration() {
        let src = "struct H {\n  static constexpr unsigned kRowThreads = 128;  // lanes\n};\n";
        assert_eq!(
            with_row_threads(src, 512).unwrap(),
            "struct H {\n  static constexpr unsigned kRowThreads = 512;  // lanes\n};\n"
        );
        assert_eq!(with_row_threads(src, 128).unwrap(), src);
        assert!(with_row_threads(src, 96)
            .unwrap_err()
            .contains("one of [32, 64"));
        assert!(with_row_threads("struct H {};", 64)
            .unwrap_err()
            .contains("declares no"));
        let twice = format!("{src}{src}");
        assert!(with_row_threads(&twice, 64)
            .unwrap_err()
            .contains("more than once"));
        assert!(with_row_threads("kRowThreads = N;", 64)
            .unwrap_err()
            .contains("not followed by a number"));
    }

    #[test]
    fn compare_names_the_first_wrong_byte_and_lengths() {
        assert!(compare(&[1, 2, 3], &[1, 2, 3], "x").is_ok());
        assert_eq!(
            compare(&[1, 9, 3], &[1, 2, 3], "msg"),
            Err("msg: byte 1 is 0x9, expected 0x2".into())
        );
        assert_eq!(
            compare(&[1], &[1, 2], "m"),
            Err("m: 1 bytes, expected 2".into())
        );
    }
}
