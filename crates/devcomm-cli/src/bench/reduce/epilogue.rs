//! `devcomm bench --op all_reduce --epilogue-rows N`: devcomm's all-reduce with the fused
//! residual add + RMSNorm epilogue (`examples/hooks/rmsnorm.cu`, f32 rows of N elements) in
//! place of its plain all-reduce, timed against NCCL's plain all-reduce of the same buffers:
//! what a tensor-parallel layer's all-reduce + norm costs with devcomm against the all-reduce
//! alone with NCCL (the norm's own kernel is left out of NCCL's side). The checked call of
//! each size stays the plain all-reduce; the epilogue's results are checked by the self-test
//! (`reduce_rmsnorm`).

use cudarc::driver::{CudaSlice, DevicePtr};
use devcomm::{DataType, HookArgs, Hooks};

use crate::selftest::Ctx;

/// The hook's source: the example's.
const RMSNORM: &str = include_str!("../../../../devcomm/examples/hooks/rmsnorm.cu");

/// The epilogue of a run: the compiled hooks and their arguments, sized for the largest
/// buffer of `rows x row` elements.
pub(super) struct Epilogue {
    pub(super) hooks: Hooks<f32, f32>,
    pub(super) row: usize,
    /// What every timed call passes: the rows and the argument struct's address.
    hook_args: HookArgs,
    _args: CudaSlice<u64>,
    _residual: CudaSlice<f32>,
    _weight: CudaSlice<f32>,
}

impl Epilogue {
    /// For all-reduces of f32 sum up to `max_elems` elements in rows of `row`.
    pub(super) fn new(
        cx: &Ctx,
        dtype: DataType,
        row: usize,
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
        let c = |e: cudarc::driver::DriverError| e.to_string();
        let residual = cx
            .stream
            .clone_htod(&vec![0.25f32; max_elems.max(row)])
            .map_err(c)?;
        let weight = cx.stream.clone_htod(&vec![1.5f32; row]).map_err(c)?;
        let args = {
            let (r, _a) = residual.device_ptr(&cx.stream);
            let (w, _b) = weight.device_ptr(&cx.stream);
            cx.stream
                .clone_htod(&[r, w, u64::from(1e-6f32.to_bits())])
                .map_err(c)?
        };
        let hook_args = HookArgs::rows(row).with_user(args.device_ptr(&cx.stream).0);
        Ok(Self {
            hooks: Hooks::new("RmsNorm", RMSNORM),
            row,
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
}
