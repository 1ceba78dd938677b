//! Inverted dropout, in place: kept elements are scaled by `1/(1−p)`.
//!
//! The mask is never stored: element `i` is kept when
//! `rng::uniform(seed, i) >= p`, so the backward pass (and any other device)
//! regenerates the identical mask from the seed.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use crate::{Backend, Error, Result};

/// Rejects drop probabilities outside `[0, 1)`.
pub(crate) fn check_p(p: f32) -> Result<()> {
    if (0.0..1.0).contains(&p) {
        Ok(())
    } else {
        Err(Error::InvalidArgument {
            op: "dropout",
            reason: format!("drop probability {p} is outside [0, 1)"),
        })
    }
}

/// Whether element `index` survives, shared by every backend's reference.
#[inline]
pub fn keeps(p: f32, seed: u64, index: u64) -> bool {
    crate::rng::uniform(seed, index) >= p
}

/// Dropout kernels.
pub trait DropoutKernel: Backend {
    /// `x = x · mask / (1 − p)` in place.
    fn dropout_fwd(&self, p: f32, seed: u64, x: &mut Self::Storage<f32>) -> Result<()>;
    /// `dy = dy · mask / (1 − p)` in place, with the same `p` and `seed`.
    fn dropout_bwd(&self, p: f32, seed: u64, dy: &mut Self::Storage<f32>) -> Result<()>;
}
