//! Mean squared error, fused with its gradient: for `batch` rows of
//! `features` predictions `y` and targets `t`, each row's loss is the mean
//! of `(y − t)²` over its features, the batch loss their mean (PyTorch's
//! `MSELoss()`, mean over every element), and
//! `dy = 2·(y − t) / (batch · features)`.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
use crate::{Backend, Result};

/// `batch` rows of `features` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct MseGeom {
    pub batch: usize,
    pub features: usize,
}

impl MseGeom {
    pub(crate) fn check<B: Backend>(
        &self,
        y: &B::Storage<f32>,
        target: &B::Storage<f32>,
        dy: Option<&B::Storage<f32>>,
        loss_sum: &B::Storage<f32>,
    ) -> Result<()> {
        let n = self.batch * self.features;
        check_len("mse", "y", B::len(y), n)?;
        check_len("mse", "target", B::len(target), n)?;
        if let Some(dy) = dy {
            check_len("mse", "dy", B::len(dy), n)?;
        }
        check_len("mse", "loss_sum", B::len(loss_sum), 1)
    }
}

/// Mean-squared-error kernels.
pub trait MseKernel: Backend {
    /// Adds the *sum* of the per-row losses to `loss_sum[0]` (an epoch
    /// accumulates on the device) and, given `dy`, writes the gradient of
    /// the batch-mean loss there.
    fn mse_fwd_bwd(
        &self,
        geom: &MseGeom,
        y: &Self::Storage<f32>,
        target: &Self::Storage<f32>,
        dy: Option<&mut Self::Storage<f32>>,
        loss_sum: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
