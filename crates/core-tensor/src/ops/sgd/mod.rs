//! Plain SGD over the flat parameter buffer, computed exactly as PyTorch's
//! `torch.optim.SGD` without momentum, dampening or weight decay:
//! `p.add_(grad, alpha=-lr)`, that is `p = p + (−lr)·g`, one rounding for
//! the product and one for the sum.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::{Backend, Error, Result};

/// Rejects a learning rate that would silently produce garbage.
pub fn validate_lr(lr: f64) -> Result<()> {
    if lr.is_finite() && lr > 0.0 {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op: "sgd",
            reason: format!("the learning rate must be finite and positive, not {lr}"),
        })
    }
}

/// The SGD step.
pub trait SgdKernel: Backend {
    /// `params -= lr · grads` in place, unless `guard` (see
    /// [`crate::ops::finite`]) says a non-finite value was seen.
    fn sgd_step(
        &self,
        lr: f32,
        params: &mut Self::Storage<f32>,
        grads: &Self::Storage<f32>,
        guard: &Self::Storage<u32>,
    ) -> Result<()>;
}
