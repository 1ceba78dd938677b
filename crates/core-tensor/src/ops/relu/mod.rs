//! ReLU, in place, with inverted dropout after it as an epilogue
//! ([`Dropout::OFF`] for none): the network's ReLUs that dropout follows
//! then read and write their values once. The backward pass masks by the
//! forward *output* (`y > 0` exactly when `x > 0` and the unit was kept), so
//! the input need not be kept.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::ops::Dropout;
use crate::{Backend, Result};

/// ReLU kernels.
pub trait ReluKernel: Backend {
    /// `x = dropout(max(x, 0))` in place.
    fn relu_fwd(&self, dropout: Dropout, x: &mut Self::Storage<f32>) -> Result<()>;
    /// `dy = dropout(dy) · [y > 0]` in place, with `y` the forward output
    /// and the forward pass's `dropout`.
    fn relu_bwd(
        &self,
        dropout: Dropout,
        y: &Self::Storage<f32>,
        dy: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
