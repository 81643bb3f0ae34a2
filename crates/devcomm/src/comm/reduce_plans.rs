//! What a reduction will do, without doing it: the plan of a call on ordinary buffers or on
//! given addresses, the window sizes, and the two lookups every call makes first (its buffers
//! resolved, their places in the memory pool). The calls themselves: `reduce_ops.rs`.

use super::reduce_ops::invalid;
use super::Comm;
use crate::error::Result;
use crate::memory::PoolLocation;
use crate::reduce::args::{resolve, Refusal, Resolved};
use crate::reduce::launch::{PoolBuffers, ReduceCall};
use crate::reduce::tuned_plan::Choice;
use crate::reduce::{Collective, DataType, Plan};

/// Why a reduction in a job with network links takes no choice of its own.
pub(super) const NO_CHOICE_BY_NETWORK: &str =
    "a job with network links reduces by the network algorithm, which takes no tuned choice";

impl Comm {
    /// The plan a reduction of `count` elements of `dtype` takes on this communicator (as the
    /// methods name the count: all-reduce elements, reduce-scatter output elements,
    /// all-gather input elements); `None` for 0 elements (nothing runs).
    pub(crate) fn reduction_plan(
        &self,
        collective: Collective,
        dtype: DataType,
        count: u64,
    ) -> Result<Option<Plan>> {
        if count == 0 {
            return Ok(None);
        }
        // What a call on ordinary buffers takes (the buffers' addresses only matter for the
        // pool; these reach no pool).
        let call = ReduceCall {
            collective,
            dtype,
            op: None,
            input: 0,
            output: 0,
            count,
            hooks: None,
            refused: false,
            pool: None,
            choice: None,
        };
        let plan = self
            .reduce
            .plan_of(&call, (self.rank(), self.world_size()))?;
        Ok(Some(plan))
    }

    /// The plan a reduction takes on these buffers (`(input, output, count)` as the raw forms
    /// take them): [`Tuning::reduction_plan`](super::Tuning::reduction_plan)'s, or a
    /// zero-copy one when the buffers lie in the memory pool (docs/COLLECTIVES.md, "Zero-copy
    /// reductions"). Nothing is launched; `None` for 0 elements.
    pub(crate) fn reduction_plan_at(
        &self,
        collective: Collective,
        dtype: DataType,
        at: (u64, u64, u64),
    ) -> Result<Option<Plan>> {
        self.reduction_plan_with(collective, dtype, at, None)
    }

    /// [`Comm::reduction_plan_at`] with `choice` in place of the tuning table's and the
    /// default plan: an error when the choice cannot serve the call (as the call would fail).
    pub(crate) fn reduction_plan_with(
        &self,
        collective: Collective,
        dtype: DataType,
        (input, output, count): (u64, u64, u64),
        choice: Option<Choice>,
    ) -> Result<Option<Plan>> {
        if choice.is_some() && self.reduce.by_network() {
            return Err(invalid(collective, self.rank())(
                NO_CHOICE_BY_NETWORK.into(),
            ));
        }
        if choice.is_none() && (self.reduce.by_network() || !self.group.config.reduce_zero_copy) {
            return self.reduction_plan(collective, dtype, count);
        }
        let es = dtype.size_bytes() as u64;
        let r = self
            .resolve_buffers(collective, (input, output, count), es)
            .map_err(|refusal| invalid(collective, self.rank())(refusal.reason))?;
        if r.count == 0 {
            return Ok(None);
        }
        let pool = match self.group.config.reduce_zero_copy {
            true => self.pool_buffers(collective, (r.input, r.output, r.count), es),
            false => None,
        };
        let call = ReduceCall {
            collective,
            dtype,
            op: None,
            input: r.input,
            output: r.output,
            count: r.count,
            hooks: None,
            refused: false,
            pool: pool.as_ref(),
            choice,
        };
        let plan = self
            .reduce
            .plan_of(&call, (self.rank(), self.world_size()))?;
        Ok(Some(plan))
    }

    /// The call's buffers checked and resolved on this rank (`resolve`).
    pub(super) fn resolve_buffers(
        &self,
        collective: Collective,
        (input, output, count): (u64, u64, u64),
        es: u64,
    ) -> std::result::Result<Resolved, Refusal> {
        resolve(
            collective,
            self.rank(),
            self.world_size(),
            input,
            output,
            count,
            es,
        )
    }

    /// Where a call's buffers lie in the memory pool, if either does with every peer's segment
    /// mapped here (the zero-copy paths' candidates).
    pub(super) fn pool_buffers(
        &self,
        collective: Collective,
        (input, output, count): (u64, u64, u64),
        es: u64,
    ) -> Option<PoolBuffers> {
        let whole = count
            .checked_mul(self.world_size() as u64)?
            .checked_mul(es)?;
        let part = count.checked_mul(es)?;
        let (in_bytes, out_bytes) = match collective {
            Collective::AllReduce => (part, part),
            Collective::ReduceScatter => (whole, part),
            Collective::AllGather => (part, whole),
        };
        let mapped = |l: &PoolLocation| l.peer_table != 0 && l.peer_bases.iter().all(|&b| b != 0);
        let found = PoolBuffers {
            input: self.pool_lookup(input, in_bytes).filter(mapped),
            output: self.pool_lookup(output, out_bytes).filter(mapped),
        };
        (found.input.is_some() || found.output.is_some()).then_some(found)
    }
}
