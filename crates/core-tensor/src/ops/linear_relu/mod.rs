//! A linear layer then ReLU and inverted dropout as one op (fc1 of the
//! CNN): on a GPU the ReLU and the dropout run in the product's store
//! (`linear_relu.cu`), or for a split K in the split reduction's, so the
//! layer's output is written once instead of written, read and written
//! again by a second kernel. The results are bit for bit those of
//! [`crate::ops::LayerKernel`] then [`crate::ops::ReluKernel`] with the
//! same dropout; the CPU composes exactly those, so models call the
//! unfused kernels there ([`crate::ops::Conv2dPoolKernel::fuses`] says
//! where the fused ops pay). Backward masks `dy` and sums the bias
//! gradient in one pass (`linear_relu_bwd_bias_f32`), then runs the layer's
//! two products on the masked `dy`: the bits of
//! [`crate::ops::ReluKernel::relu_bwd`] then
//! [`crate::ops::LayerKernel::layer_bwd`].

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::ops::{Dropout, LinearGeom, ParamAt};
use crate::{Backend, Result};

/// Linear + ReLU + dropout kernels.
pub trait LinearReluKernel: Backend {
    /// `y = dropout(max(x·Wᵀ + b, 0))`, with `W` and `b` read from
    /// `params` at `at` and `dropout`'s mask by the element index of `y`
    /// (NaN and -0 pass the ReLU, as [`crate::ops::ReluKernel`] leaves
    /// them).
    fn linear_relu_fwd(
        &self,
        g: &LinearGeom,
        dropout: Dropout,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        y: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// The backward pass of [`Self::linear_relu_fwd`], given its inputs,
    /// `dropout` and `saved = (y, dy)`, its output and that output's
    /// gradient: `dy` masked in place (`dy =
    /// dropout(dy) · [y > 0]`, as [`crate::ops::ReluKernel::relu_bwd`]),
    /// then `dW` and `db` into `grads` at `at`, and `dx` when asked for.
    #[allow(clippy::too_many_arguments)]
    fn linear_relu_bwd(
        &self,
        g: &LinearGeom,
        dropout: Dropout,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        saved: (&Self::Storage<f32>, &mut Self::Storage<f32>),
        grads: &mut Self::Storage<f32>,
        dx: Option<&mut Self::Storage<f32>>,
    ) -> Result<()>;
}
