//! conv2d, then 2x2 max-pooling and its [`Epilogue`] (ReLU and dropout), as
//! one op that keeps only the pooled values and each window's argmax: on a
//! GPU the convolution's output never reaches memory (`conv2d_pool.cu`),
//! and backward routes the pooled gradients by the argmax bytes instead of
//! reading that output again. The results are bit for bit those of
//! [`crate::ops::LayerKernel`] then [`crate::ops::MaxPool2dKernel`]; the
//! CPU composes exactly those kernels, so it saves nothing there
//! ([`Conv2dPoolKernel::fuses`] tells a model which path to take).

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
use crate::ops::{Conv2dGeom, Epilogue, ParamAt, PoolGeom};
use crate::{Backend, Result};

/// The pooling of `g`'s output: its channels and planes, odd trailing rows
/// and columns dropped.
pub fn pool_of(g: &Conv2dGeom) -> PoolGeom {
    PoolGeom {
        batch: g.batch,
        channels: g.out_channels,
        in_h: g.out_h(),
        in_w: g.out_w(),
    }
}

/// Checks the pooled values' and the argmax bytes' lengths against `g` (the
/// convolution's buffers are checked by its own kernels).
fn check_pooled<B: Backend>(
    g: &Conv2dGeom,
    y: &B::Storage<f32>,
    argmax: &B::Storage<u8>,
) -> Result<PoolGeom> {
    g.validate()?;
    let pool = pool_of(g);
    pool.check_window()?;
    check_len("conv2d_pool", "y", B::len(y), pool.output_len())?;
    check_len("conv2d_pool", "argmax", B::len(argmax), pool.output_len())?;
    Ok(pool)
}

/// The fused backward pass's view of its forward pass's inputs: `x`, the
/// parameters, and where the layer's sit in them.
pub type ConvInputs<'a, B> = (
    &'a <B as Backend>::Storage<f32>,
    &'a <B as Backend>::Storage<f32>,
    &'a ParamAt,
);

/// What the fused forward pass kept, and the gradient that came back:
/// the argmax bytes, the pooled values `y`, and `dy`.
pub type PoolSaved<'a, B> = (
    &'a <B as Backend>::Storage<u8>,
    &'a <B as Backend>::Storage<f32>,
    &'a <B as Backend>::Storage<f32>,
);

/// conv2d + max-pool kernels.
pub trait Conv2dPoolKernel: Backend {
    /// `y = then(maxpool(conv(x, W) + b))`, with `W` and `b` read from
    /// `params` at `at`, and `argmax[i]` the place (0–3, row-major) of
    /// pooled value i's maximum in its window: the first maximum, or the
    /// first NaN (PyTorch's rule, `MaxPool2dKernel`'s).
    #[allow(clippy::too_many_arguments)]
    fn conv2d_pool_fwd(
        &self,
        g: &Conv2dGeom,
        then: Epilogue,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        y: &mut Self::Storage<f32>,
        argmax: &mut Self::Storage<u8>,
    ) -> Result<()>;

    /// The backward pass of [`Self::conv2d_pool_fwd`], given its `inputs`
    /// `(x, params, at)` and `saved = (argmax, y, dy)`: the pooled gradient
    /// `dy` through `then`'s masks (by the forward output `y`), routed by
    /// `argmax` into `da` (the convolution's output gradient, overwritten),
    /// then the convolution's `dW` and `db` into `grads` at `at`, and `dx`
    /// when asked for.
    #[allow(clippy::too_many_arguments)]
    fn conv2d_pool_bwd(
        &self,
        g: &Conv2dGeom,
        then: Epilogue,
        inputs: ConvInputs<'_, Self>,
        saved: PoolSaved<'_, Self>,
        da: &mut Self::Storage<f32>,
        grads: &mut Self::Storage<f32>,
        dx: Option<&mut Self::Storage<f32>>,
    ) -> Result<()>;

    /// Whether the fused ops (this, and the fused kernels
    /// [`crate::ops::LayerKernel::layer_relu_fwd`] runs) save passes here:
    /// true on a GPU (unless told otherwise, `Cuda::with_fusion`), false on
    /// the CPU, whose fused ops only compose the unfused ones. A model asks
    /// it before `conv2d_pool_fwd`; `layer_relu_fwd` asks it itself.
    fn fuses(&self) -> bool;
}
