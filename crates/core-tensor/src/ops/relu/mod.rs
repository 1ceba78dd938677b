//! ReLU, in place. The backward pass masks by the forward *output*
//! (`y > 0` exactly when `x > 0`), so the input need not be kept.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use crate::{Backend, Result};

/// ReLU kernels.
pub trait ReluKernel: Backend {
    /// `x = max(x, 0)` in place.
    fn relu_fwd(&self, x: &mut Self::Storage<f32>) -> Result<()>;
    /// `dy = dy · [y > 0]` in place, with `y` the forward output.
    fn relu_bwd(&self, y: &Self::Storage<f32>, dy: &mut Self::Storage<f32>) -> Result<()>;
}
