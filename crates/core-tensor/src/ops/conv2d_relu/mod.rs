//! conv2d then ReLU as one op: on a GPU the ReLU runs in the product's
//! store (`conv2d_relu.cu`), so the convolution's output is written once
//! instead of written, read and written again by a second kernel. The
//! results are bit for bit those of [`crate::ops::LayerKernel`] then
//! [`crate::ops::ReluKernel`] (no dropout); the CPU composes exactly those,
//! so models call the unfused kernels there
//! ([`crate::ops::Conv2dPoolKernel::fuses`] says where the fused ops pay).
//! Backward is ReLU's and the convolution's own kernels.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::ops::{Conv2dGeom, ParamAt};
use crate::{Backend, Result};

/// conv2d + ReLU kernels.
pub trait Conv2dReluKernel: Backend {
    /// `y = max(conv(x, W) + b, 0)`, with `W` and `b` read from `params`
    /// at `at` (NaN and -0 pass, as [`crate::ops::ReluKernel`] leaves them).
    fn conv2d_relu_fwd(
        &self,
        g: &Conv2dGeom,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        y: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
