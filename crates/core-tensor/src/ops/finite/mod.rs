//! The finiteness guard in front of the optimizer. It notes the first step
//! whose loss or gradients hold a NaN or an infinity in a small device
//! buffer that the Adam kernel reads: from that step on every update is
//! skipped, on the device, so the parameters stay those before the bad step
//! and the host needs no per-step synchronisation to enforce it. The host
//! reads the guard whenever it looks at the device anyway (logging,
//! checkpoints) and stops with the step and the parameter named.
//!
//! A step may check its gradients in parts (`--sparse-adam` checks the
//! dense ranges and the rows of its tables the step used, not the whole
//! buffer): every call of a step after the first goes on where the guard
//! was tripped at that same step, and the index only ever decreases, so
//! the guard holds the smallest bad index of all the step's calls, in any
//! order of calls and of threads.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::error::check_len;
use crate::ops::RowsGeom;
use crate::{Backend, Error, Result};

/// Elements of a guard buffer: `[step, index]`. `step` is the (1-based)
/// step at which a non-finite value was first seen, 0 while none was;
/// `index` the smallest index of a non-finite gradient at that step
/// (`u32::MAX` when only the loss was).
pub const GUARD_LEN: usize = 2;

/// A guard that has seen nothing.
pub const GUARD_CLEAR: [u32; GUARD_LEN] = [0, u32::MAX];

/// What a guard buffer says, read back on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuardState {
    Clear,
    /// Step `step` met a non-finite value; `index` is the first bad
    /// gradient element, if the gradients (not only the loss) were bad.
    Tripped {
        step: u32,
        index: Option<usize>,
    },
}

impl GuardState {
    pub fn from_words(words: [u32; GUARD_LEN]) -> Self {
        match words {
            [0, _] => GuardState::Clear,
            [step, index] => GuardState::Tripped {
                step,
                index: (index != u32::MAX).then_some(index as usize),
            },
        }
    }
}

/// The guard kernels. Each trips `guard` at `step` (≥ 1) if a value it
/// checks is not finite, unless the guard was tripped at an earlier step
/// (it keeps the first step); at the same step it lowers the index to the
/// smallest bad one seen.
pub trait FiniteKernel: Backend {
    /// Checks `loss[0]` and `values[range]`; the index is `values`'.
    fn guard_finite_range(
        &self,
        step: u32,
        loss: &Self::Storage<f32>,
        values: &Self::Storage<f32>,
        range: Range<usize>,
        guard: &mut Self::Storage<u32>,
    ) -> Result<()>;

    /// [`FiniteKernel::guard_finite_range`] over all of `values`.
    fn guard_finite(
        &self,
        step: u32,
        loss: &Self::Storage<f32>,
        values: &Self::Storage<f32>,
        guard: &mut Self::Storage<u32>,
    ) -> Result<()> {
        let all = 0..Self::len(values);
        self.guard_finite_range(step, loss, values, all, guard)
    }

    /// Checks the `rows.count` rows of the table `rows` places in `values`
    /// that the first `rows.count` of `ids` (increasing, below `rows.rows`)
    /// name, and nothing else (not the loss).
    fn guard_finite_rows(
        &self,
        step: u32,
        rows: &RowsGeom,
        ids: &Self::Storage<u32>,
        values: &Self::Storage<f32>,
        guard: &mut Self::Storage<u32>,
    ) -> Result<()>;
}

/// The checks every guard kernel applies before touching the buffers: a
/// step from 1, a two-word guard, and indices of `values_len` values that
/// fit the guard's u32.
fn check(step: u32, values_len: usize, guard_len: usize) -> Result<()> {
    check_len("guard_finite", "guard", guard_len, GUARD_LEN)?;
    if step == 0 {
        return Err(invalid(
            "steps count from 1 (0 means no step tripped the guard)".into(),
        ));
    }
    if u32::try_from(values_len).is_err() {
        return Err(invalid(format!(
            "{values_len} values do not fit the guard's u32 index"
        )));
    }
    Ok(())
}

/// [`check`], one loss, and `range` inside the values.
pub(crate) fn check_range(
    step: u32,
    loss_len: usize,
    values_len: usize,
    range: &Range<usize>,
    guard_len: usize,
) -> Result<()> {
    check(step, values_len, guard_len)?;
    check_len("guard_finite", "loss", loss_len, 1)?;
    if range.start <= range.end && range.end <= values_len {
        return Ok(());
    }
    Err(invalid(format!(
        "the range {range:?} is not inside the {values_len} values"
    )))
}

/// [`check`], `rows.count` ids, and the table inside the values (the ids'
/// values: `RowsGeom::check_ids`).
pub(crate) fn check_rows(
    step: u32,
    rows: &RowsGeom,
    ids_len: usize,
    values_len: usize,
    guard_len: usize,
) -> Result<()> {
    check(step, values_len, guard_len)?;
    rows.check_table("guard_finite", ids_len, values_len, "values")
}

fn invalid(reason: String) -> Error {
    Error::InvalidArgument {
        op: "guard_finite",
        reason,
    }
}
