//! Per-sample offsets added to an output: for `batch` samples with `k`
//! offsets each, `y[i] += o[i·k] + … + o[i·k + k − 1]` (added to `y` left to
//! right), and backward `do[i·k + j] = dy[i]`. A recommender's user and
//! movie biases, gathered by the embedding op, join its prediction here.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
use crate::{Backend, Result};

/// `batch` samples of `k` offsets each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct OffsetGeom {
    pub batch: usize,
    pub k: usize,
}

impl OffsetGeom {
    pub(crate) fn check<B: Backend>(
        &self,
        offsets: &B::Storage<f32>,
        y: &B::Storage<f32>,
    ) -> Result<()> {
        check_len("offset", "offsets", B::len(offsets), self.batch * self.k)?;
        check_len("offset", "y", B::len(y), self.batch)
    }
}

/// Offset kernels.
pub trait OffsetKernel: Backend {
    /// `y[i] += Σⱼ offsets[i·k + j]`, in `j` order.
    fn offset_fwd(
        &self,
        geom: &OffsetGeom,
        offsets: &Self::Storage<f32>,
        y: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// `d_offsets[i·k + j] = dy[i]`.
    fn offset_bwd(
        &self,
        geom: &OffsetGeom,
        dy: &Self::Storage<f32>,
        d_offsets: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
