//! The number of rows whose argmax (first maximum) equals the label.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::ops::ClassGeom;
use crate::{Backend, Result};

/// Accuracy kernels.
pub trait AccuracyKernel: Backend {
    /// Adds the number of correct rows to `correct[0]` (a count kept in f32:
    /// exact up to 2²⁴, far above any epoch here).
    fn count_correct(
        &self,
        geom: &ClassGeom,
        logits: &Self::Storage<f32>,
        labels: &Self::Storage<u8>,
        correct: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
