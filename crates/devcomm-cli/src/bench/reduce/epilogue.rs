//! `devcomm bench --op all_reduce --epilogue-rows N [--epilogue-row-threads T]`: devcomm's
//! all-reduce with the fused residual add + RMSNorm epilogue (`examples/hooks/rmsnorm.cu`, f32
//! rows of N elements, T threads a row: the hook's `kRowThreads`, its own 128 unless set) in
//! place of its plain all-reduce, timed against NCCL's plain all-reduce of the same buffers:
//! what a tensor-parallel layer's all-reduce + norm costs with devcomm against the all-reduce
//! alone with NCCL (the norm's own kernel is left out of NCCL's side). The checked call of each
//! size is the hooked one, bit for bit against the plain reduction (NCCL's, or the host's)
//! followed by the hook's host reference at T lanes a row (`reference_row` of
//! `examples/all_reduce_rmsnorm.rs`).

use cudarc::driver::{CudaSlice, DevicePtr};
use devcomm::{DataType, HookArgs, Hooks};

use crate::examples::all_reduce_rmsnorm::{reference_row, RMSNORM_HOOKS, RMSNORM_ROW_THREADS};
use crate::selftest::{with_row_threads, Ctx};

/// What every row's residual and every column's weight hold (the data are the reduction's).
const RESIDUAL: f32 = 0.25;
const WEIGHT: f32 = 1.5;
const EPS: f32 = 1e-6;

/// The epilogue of a run: the compiled hooks and their arguments, sized for the largest
/// buffer of `rows x row` elements.
pub(super) struct Epilogue {
    pub(super) hooks: Hooks<f32, f32>,
    pub(super) row: usize,
    /// Threads a row (the hook's `kRowThreads`).
    pub(super) lanes: u32,
    /// What every timed call passes: the rows and the argument struct's address.
    hook_args: HookArgs,
    _args: CudaSlice<u64>,
    _residual: CudaSlice<f32>,
    _weight: CudaSlice<f32>,
}

/// The hook's source and its threads a row: the example's, or with `kRowThreads` set to
/// `threads`.
pub(super) fn hook_source(threads: Option<u32>) -> Result<(String, u32), String> {
    match threads {
        None => Ok((RMSNORM_HOOKS.to_string(), RMSNORM_ROW_THREADS)),
        Some(t) => Ok((
            with_row_threads(RMSNORM_HOOKS, t)
                .map_err(|e| format!("--epilogue-row-threads: {e}"))?,
            t,
        )),
    }
}

impl Epilogue {
    /// For all-reduces of f32 sum up to `max_elems` elements in rows of `row`, `threads` a row
    /// (None: the hook's own).
    pub(super) fn new(
        cx: &Ctx,
        dtype: DataType,
        row: usize,
        threads: Option<u32>,
        max_elems: usize,
    ) -> Result<Self, String> {
        if dtype != DataType::F32 {
            return Err(format!(
                "--epilogue-rows times the f32 RMSNorm example: use --dtype f32 (not {dtype})"
            ));
        }
        if row == 0 {
            return Err("--epilogue-rows must be at least 1".into());
        }
        let (source, lanes) = hook_source(threads)?;
        let c = |e: cudarc::driver::DriverError| e.to_string();
        let residual = cx
            .stream
            .clone_htod(&vec![RESIDUAL; max_elems.max(row)])
            .map_err(c)?;
        let weight = cx.stream.clone_htod(&vec![WEIGHT; row]).map_err(c)?;
        let args = {
            let (r, _a) = residual.device_ptr(&cx.stream);
            let (w, _b) = weight.device_ptr(&cx.stream);
            cx.stream
                .clone_htod(&[r, w, u64::from(EPS.to_bits())])
                .map_err(c)?
        };
        let hook_args = HookArgs::rows(row).with_user(args.device_ptr(&cx.stream).0);
        Ok(Self {
            hooks: Hooks::new("RmsNorm", &source),
            row,
            lanes,
            hook_args,
            _args: args,
            _residual: residual,
            _weight: weight,
        })
    }

    /// The hook's arguments (rows of `row`, the argument struct's address).
    pub(super) fn hook_args(&self) -> &HookArgs {
        &self.hook_args
    }

    /// Whether a call of `count` elements is whole rows.
    pub(super) fn fits(&self, count: usize) -> bool {
        count > 0 && count % self.row == 0
    }

    /// What the hooked call leaves given the plain all-reduce's output `reduced` (f32 bytes):
    /// the hook's host reference on every row, at this run's threads a row.
    pub(super) fn reference(&self, reduced: &[u8]) -> Vec<u8> {
        let x: Vec<f32> = reduced
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let residual = vec![RESIDUAL; self.row];
        let weight = vec![WEIGHT; self.row];
        x.chunks(self.row)
            .flat_map(|r| reference_row(r, &residual, &weight, EPS, self.lanes))
            .flat_map(f32::to_le_bytes)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hook_is_the_example_unless_its_row_group_is_set() {
        let (own, lanes) = hook_source(None).unwrap();
        assert_eq!((own.as_str(), lanes), (RMSNORM_HOOKS, RMSNORM_ROW_THREADS));
        assert!(own.contains(&format!("kRowThreads = {RMSNORM_ROW_THREADS};")));
        for t in devcomm::reduce::rows::ROW_THREADS {
            let (src, lanes) = hook_source(Some(t)).unwrap();
            assert_eq!(lanes, t);
            assert!(src.contains(&format!("kRowThreads = {t};")), "{t}");
        }
        let e = hook_source(Some(100)).unwrap_err();
        assert!(
            e.starts_with("--epilogue-row-threads: 100 threads a row"),
            "{e}"
        );
    }
}
