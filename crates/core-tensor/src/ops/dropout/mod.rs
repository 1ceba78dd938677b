//! Inverted dropout: kept elements are scaled by `1/(1−p)`, the others
//! zeroed. It has no kernel of its own: it runs as the epilogue of the
//! kernels whose outputs it drops ([`crate::ops::ReluKernel`], and
//! [`crate::ops::MaxPool2dKernel`] with [`crate::ops::Epilogue::ReluDropout`]),
//! so the values are read and written once, in one launch on a GPU.
//!
//! The mask is never stored: element `i` is kept when
//! `rng::uniform(seed, i) >= p`, so the backward pass (and any other device)
//! regenerates the identical mask from the seed. `dropout.cuh`, beside
//! this file, is the GPU's copy of [`Dropout::apply`], which the kernels
//! with a dropout epilogue include as `"dropout/dropout.cuh"`.

pub(super) mod cuda;
pub(crate) mod mask;
#[cfg(test)]
mod tests;

use crate::{Error, Result};

/// One dropout layer's draw for one step: drop probability `p` and the
/// seed of its mask.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    pub p: f32,
    pub seed: u64,
}

impl Dropout {
    /// No dropout: every value passes unchanged (evaluation, or a model
    /// without it).
    pub const OFF: Self = Self { p: 0.0, seed: 0 };

    /// Rejects drop probabilities outside `[0, 1)`.
    pub(crate) fn check(&self) -> Result<()> {
        if (0.0..1.0).contains(&self.p) {
            Ok(())
        } else {
            Err(Error::InvalidArgument {
                op: "dropout",
                reason: format!("drop probability {} is outside [0, 1)", self.p),
            })
        }
    }

    /// Whether it leaves every value unchanged (`p = 0`), so that a kernel
    /// can skip the mask.
    pub(crate) fn is_off(&self) -> bool {
        self.p == 0.0
    }

    /// Whether element `index` survives, shared by every backend's
    /// reference.
    #[inline]
    pub fn keeps(&self, index: u64) -> bool {
        crate::rng::uniform(self.seed, index) >= self.p
    }

    /// What kept values are multiplied by.
    #[inline]
    pub(crate) fn scale(&self) -> f32 {
        1.0 / (1.0 - self.p)
    }

    /// `v` at element `index` after the mask: scaled if kept, else zero.
    /// Forward and backward are the same map.
    #[inline]
    pub(crate) fn apply(&self, index: u64, v: f32) -> f32 {
        if self.keeps(index) {
            v * self.scale()
        } else {
            0.0
        }
    }
}
