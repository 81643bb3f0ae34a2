//! The typed forms of [`Moe`]'s calls: the slices' sizes checked against the plan, then the
//! raw calls (`dispatch_raw`, `combine_raw`) on their device addresses.

use std::sync::Arc;

use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut};

use super::{DispatchBuffers, Moe};
use crate::comm::Comm;
use crate::error::Result;
use crate::moe::DispatchBytes;

impl Moe {
    /// Dispatches `x` (`[tokens, hidden]`) to the experts of `topk_idx` with `topk_weights`
    /// (`[tokens, top_k]`): `out_x` (`[out_rows, hidden]`) receives this rank's experts' rows,
    /// grouped by local expert (each group padded to `align` rows; padding rows are left as
    /// they were), `out_weights` each row's weight and `expert_counts` the rows of each local
    /// expert. A token crosses to each rank once, however many of its experts live there.
    /// Ids outside `[-1, experts)` and repeats within a token are dropped and counted; an
    /// `out_x` too small for the routing is left untouched: [`Moe::check`] reports both.
    /// With an FP8 wire that dequantises, `out_x` holds the dequantised rows; a wire that
    /// returns FP8 takes [`Moe::dispatch_fp8`] instead.
    #[allow(clippy::too_many_arguments)] // the dispatch's three inputs and three outputs
    pub fn dispatch<T, X, I, W, O, OW, C>(
        &self,
        comm: &Comm,
        x: &X,
        topk_idx: &I,
        topk_weights: &W,
        out_x: &mut O,
        out_weights: &mut OW,
        expert_counts: &mut C,
        stream: &Arc<CudaStream>,
    ) -> Result<()>
    where
        X: DevicePtr<T>,
        I: DevicePtr<i64>,
        W: DevicePtr<f32>,
        O: DevicePtrMut<T>,
        OW: DevicePtrMut<f32>,
        C: DevicePtrMut<i64>,
    {
        self.dispatch_checked(
            comm,
            (x, topk_idx, topk_weights),
            out_x,
            None::<&mut cudarc::driver::CudaSlice<f32>>,
            (out_weights, expert_counts),
            stream,
        )
    }

    /// [`Moe::dispatch`] for a layer whose wire returns FP8 (`Wire::Fp8` with
    /// `Fp8Output::Fp8`): `out_x` (`u8 [out_rows, hidden]`) receives the rows' e4m3 codes
    /// (OCP e4m3fn) as they crossed, `out_scales` (`f32 [out_rows, plan().scales]`) their
    /// scales: element `i` of a row is `e4m3(code[i]) x scales[i / plan().scale_block]`.
    #[allow(clippy::too_many_arguments)] // the dispatch's three inputs and four outputs
    pub fn dispatch_fp8<T, X, I, W, O, S, OW, C>(
        &self,
        comm: &Comm,
        x: &X,
        topk_idx: &I,
        topk_weights: &W,
        (out_x, out_scales): (&mut O, &mut S),
        out_weights: &mut OW,
        expert_counts: &mut C,
        stream: &Arc<CudaStream>,
    ) -> Result<()>
    where
        X: DevicePtr<T>,
        I: DevicePtr<i64>,
        W: DevicePtr<f32>,
        O: DevicePtrMut<u8>,
        S: DevicePtrMut<f32>,
        OW: DevicePtrMut<f32>,
        C: DevicePtrMut<i64>,
    {
        self.dispatch_checked(
            comm,
            (x, topk_idx, topk_weights),
            out_x,
            Some(out_scales),
            (out_weights, expert_counts),
            stream,
        )
    }

    /// [`Moe::dispatch`] and [`Moe::dispatch_fp8`]: the sizes checked against the plan (`out_x`
    /// of `U`: the row type, or the e4m3 codes with `out_scales`), then the raw dispatch on the
    /// slices' addresses.
    fn dispatch_checked<T, U, X, I, W, O, S, OW, C>(
        &self,
        comm: &Comm,
        (x, topk_idx, topk_weights): (&X, &I, &W),
        out_x: &mut O,
        out_scales: Option<&mut S>,
        (out_weights, expert_counts): (&mut OW, &mut C),
        stream: &Arc<CudaStream>,
    ) -> Result<()>
    where
        X: DevicePtr<T>,
        I: DevicePtr<i64>,
        W: DevicePtr<f32>,
        O: DevicePtrMut<U>,
        S: DevicePtrMut<f32>,
        OW: DevicePtrMut<f32>,
        C: DevicePtrMut<i64>,
    {
        let (tokens, out_rows) = self.plan.dispatch_rows(DispatchBytes {
            x_elem: std::mem::size_of::<T>(),
            x: x.num_bytes(),
            topk_idx: topk_idx.num_bytes(),
            topk_weights: topk_weights.num_bytes(),
            out_elem: std::mem::size_of::<U>(),
            out_x: out_x.num_bytes(),
            out_weights: out_weights.num_bytes(),
            out_scales: out_scales.as_ref().map(|s| s.num_bytes()),
            expert_counts: expert_counts.num_bytes(),
        })?;
        let (xp, _a) = comm.slice_ptr("moe dispatch", x, stream)?;
        let (ip, _b) = comm.slice_ptr("moe dispatch", topk_idx, stream)?;
        let (wp, _c) = comm.slice_ptr("moe dispatch", topk_weights, stream)?;
        let (op, _d) = comm.slice_ptr_mut("moe dispatch", out_x, stream)?;
        let (sp, _e) = match out_scales {
            Some(scales) => {
                let (p, guard) = comm.slice_ptr_mut("moe dispatch", scales, stream)?;
                (p, Some(guard))
            }
            None => (0, None),
        };
        let (owp, _f) = comm.slice_ptr_mut("moe dispatch", out_weights, stream)?;
        let (cp, _g) = comm.slice_ptr_mut("moe dispatch", expert_counts, stream)?;
        let b = DispatchBuffers {
            x: xp,
            topk_idx: ip,
            topk_weights: wp,
            tokens,
            out_x: op,
            out_scales: sp,
            out_weights: owp,
            out_rows,
            expert_counts: cp,
        };
        // SAFETY: sizes checked above; the slices stay borrowed (and cudarc orders them on the
        // stream) for the call.
        unsafe { self.dispatch_raw(comm, b, stream) }
    }

    /// Sends the experts' outputs `y` (`[out_rows, hidden]`, in the last dispatch's
    /// expert-major order) back and combines each token: `out` (`[tokens, hidden]`) = the sum,
    /// over the ranks the token went to in rank order, of each rank's sum of weight x output
    /// over the token's experts there in ascending expert order, in f32, rounded once per rank
    /// and once at the end (docs/MOE.md). Bitwise reproducible: a token's result depends only
    /// on its routing and its experts' outputs. A token with no expert gets zeros.
    pub fn combine<T, Y: DevicePtr<T>, O: DevicePtrMut<T>>(
        &self,
        comm: &Comm,
        y: &Y,
        out: &mut O,
        stream: &Arc<CudaStream>,
    ) -> Result<()> {
        let (yb, ob) = (y.num_bytes(), out.num_bytes());
        let (yp, _a) = comm.slice_ptr("moe combine", y, stream)?;
        let (op, _b) = comm.slice_ptr_mut("moe combine", out, stream)?;
        // SAFETY: the slices' sizes are given and checked against the last dispatch.
        unsafe { self.combine_raw(comm, (yp, yb), (op, ob), stream) }
    }
}
