//! Assembles a training batch on the device from the resident dataset: the
//! raw `u8` images are gathered by sample index and scaled to `[0, 1]`
//! exactly as torchvision's `ToTensor` does (`x / 255`), labels alongside.
//! Either half may be left out: a pipeline's first stage reads only the
//! images, its last only the labels.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use std::ops::Range;

use crate::error::check_len;
use crate::{Backend, Error, Result};

/// Validates the buffers of a gather of `positions` from `indices`, for
/// every backend alike.
pub(crate) fn check<B: Backend>(
    images: &B::Shared<u8>,
    labels: &B::Shared<u8>,
    pixels: usize,
    indices: &B::Storage<u32>,
    positions: &Range<usize>,
    x: Option<&B::Storage<f32>>,
    y: Option<&B::Storage<u8>>,
) -> Result<()> {
    let batch = positions.len();
    if x.is_none() && y.is_none() {
        return Err(Error::InvalidArgument {
            op: "gather_batch",
            reason: "neither images nor labels were asked for: pass `x`, `y` or both".into(),
        });
    }
    if let Some(x) = x {
        check_len("gather_batch", "x", B::len(x), batch * pixels)?;
    }
    if let Some(y) = y {
        check_len("gather_batch", "y", B::len(y), batch)?;
    }
    check_len(
        "gather_batch",
        "images",
        B::shared_len(images),
        B::shared_len(labels) * pixels,
    )?;
    if positions.start > positions.end || positions.end > B::len(indices) {
        return Err(Error::InvalidArgument {
            op: "gather_batch",
            reason: format!(
                "positions {positions:?} exceed the {} indices",
                B::len(indices)
            ),
        });
    }
    Ok(())
}

/// Batch-gathering kernels.
pub trait GatherKernel: Backend {
    /// For each `b`, copies sample `indices[positions.start + b]` of
    /// `images` into row `b` of `x` and of `labels` into `y[b]`, for those
    /// of `x` and `y` given (at least one). `x` holds
    /// `positions.len() · pixels` values. The data set is read-only, and
    /// may be shared by the ranks of a process ([`Backend::share`]).
    #[allow(clippy::too_many_arguments)]
    fn gather_batch(
        &self,
        images: &Self::Shared<u8>,
        labels: &Self::Shared<u8>,
        pixels: usize,
        indices: &Self::Storage<u32>,
        positions: Range<usize>,
        x: Option<&mut Self::Storage<f32>>,
        y: Option<&mut Self::Storage<u8>>,
    ) -> Result<()>;
}
