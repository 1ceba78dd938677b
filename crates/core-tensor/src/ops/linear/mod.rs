//! Fully connected layer `y = x·Wᵀ + b` with PyTorch's `[out, in]` weight.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use super::LayerLens;

/// The launch parameters of the linear GEMM kernels (`LinearLaunch` in C): the
/// geometry and the tiling.
pub(crate) type LinearLaunch = crate::backend::cuda::launch::GemmLaunch<LinearGeom>;

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
