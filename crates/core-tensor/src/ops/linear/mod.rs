//! Fully connected layer `y = x·Wᵀ + b` with PyTorch's `[out, in]` weight.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use super::{LayerLens, ParamAt};
use crate::{Backend, Result};

/// The shape of one linear call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct LinearGeom {
    pub batch: usize,
    pub in_features: usize,
    pub out_features: usize,
}

impl LinearGeom {
    /// The lengths of every buffer of a call.
    pub(crate) fn lens(&self) -> LayerLens {
        LayerLens {
            op: "linear",
            x: self.batch * self.in_features,
            y: self.batch * self.out_features,
            weight: self.in_features * self.out_features,
            bias: self.out_features,
        }
    }
}

/// Linear-layer kernels.
pub trait LinearKernel: Backend {
    fn linear_fwd(
        &self,
        geom: &LinearGeom,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        y: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// Writes `dW = dyᵀ·x` and `db = Σ dy` into `grads` at `at`, and
    /// `dx = dy·W` when asked for.
    #[allow(clippy::too_many_arguments)]
    fn linear_bwd(
        &self,
        geom: &LinearGeom,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        dy: &Self::Storage<f32>,
        grads: &mut Self::Storage<f32>,
        dx: Option<&mut Self::Storage<f32>>,
    ) -> Result<()>;
}
