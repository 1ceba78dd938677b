//! Gradient accumulation (`--accumulate-steps`, PyTorch's `no_sync()`):
//! the micro-batches of one optimizer step add their gradients, each
//! weighted by its share of the step's samples, into one sum, in
//! micro-batch order: `acc = acc + w·g`, and for the last micro-batch
//! `g = acc + w·g`, written where the averaging reads it. One rounding for
//! the product and one for the sum, as `grad.add_(g, alpha=w)`.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::{Backend, Error, Result};

/// Where a weighted addition's sum goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SumInto {
    /// Into the accumulator (every micro-batch but the last).
    Acc,
    /// Into the gradients (the last micro-batch: the step's gradient).
    Grads,
}

/// The accumulation of one micro-batch's gradients.
pub trait AccumulateKernel: Backend {
    /// `acc + weight·grads` over `range` of both, into `into`; the other
    /// buffer is left as it was.
    fn accumulate(
        &self,
        weight: f32,
        grads: &mut Self::Storage<f32>,
        acc: &mut Self::Storage<f32>,
        range: Range<usize>,
        into: SumInto,
    ) -> Result<()>;
}

/// Refuses buffers of different lengths and a range outside them.
fn check(grads: usize, acc: usize, range: &Range<usize>) -> Result<()> {
    crate::error::check_len("accumulate", "acc", acc, grads)?;
    if range.start > range.end || range.end > grads {
        return Err(Error::InvalidArgument {
            op: "accumulate",
            reason: format!("range {range:?} lies outside the {grads}-element gradients"),
        });
    }
    Ok(())
}
