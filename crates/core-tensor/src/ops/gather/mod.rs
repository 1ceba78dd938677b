//! Assembles a training batch on the device from the resident dataset: the
//! raw `u8` images are gathered by sample index and scaled to `[0, 1]`
//! exactly as torchvision's `ToTensor` does (`x / 255`), labels alongside.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::{Backend, Result};

/// Batch-gathering kernels.
pub trait GatherKernel: Backend {
    /// For each `b`, copies sample `indices[positions.start + b]` of
    /// `images`/`labels` into row `b` of `x`/`y`. `x` holds
    /// `positions.len() · pixels` values.
    #[allow(clippy::too_many_arguments)]
    fn gather_batch(
        &self,
        images: &Self::Storage<u8>,
        labels: &Self::Storage<u8>,
        pixels: usize,
        indices: &Self::Storage<u32>,
        positions: Range<usize>,
        x: &mut Self::Storage<f32>,
        y: &mut Self::Storage<u8>,
    ) -> Result<()>;
}
