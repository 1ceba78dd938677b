//! The finiteness guard in front of the optimizer. It notes the first step
//! whose loss or gradients hold a NaN or an infinity in a small device
//! buffer that the Adam kernel reads: from that step on every update is
//! skipped, on the device, so the parameters stay those before the bad step
//! and the host needs no per-step synchronisation to enforce it. The host
//! reads the guard whenever it looks at the device anyway (logging,
//! checkpoints) and stops with the step and the parameter named.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
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

/// The guard kernel.
pub trait FiniteKernel: Backend {
    /// Trips `guard` at `step` (≥ 1) if `loss[0]` or any of `values` is not
    /// finite, unless it was tripped before (it keeps the first step).
    fn guard_finite(
        &self,
        step: u32,
        loss: &Self::Storage<f32>,
        values: &Self::Storage<f32>,
        guard: &mut Self::Storage<u32>,
    ) -> Result<()>;
}

/// The checks both backends apply before touching the buffers.
pub(crate) fn check(step: u32, loss_len: usize, values_len: usize, guard_len: usize) -> Result<()> {
    check_len("guard_finite", "loss", loss_len, 1)?;
    check_len("guard_finite", "guard", guard_len, GUARD_LEN)?;
    if step == 0 {
        return Err(Error::InvalidArgument {
            op: "guard_finite",
            reason: "steps count from 1 (0 means no step tripped the guard)".into(),
        });
    }
    if u32::try_from(values_len).is_err() {
        return Err(Error::InvalidArgument {
            op: "guard_finite",
            reason: format!("{values_len} values do not fit the guard's u32 index"),
        });
    }
    Ok(())
}
