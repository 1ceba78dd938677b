//! 2-D convolution, NCHW input, OIHW weight, per-channel bias, square kernel,
//! stride and zero padding. On x86-64 with AVX2 or AVX-512, stride-1
//! unpadded layers (both of CNN_MNIST's) run on wide rows with hand-written
//! microkernels (`wide.rs`, `crate::simd`): no im2col buffer, no GEMM
//! packing. Everything else is im2col + GEMM.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;
mod wide;

use super::LayerLens;
use crate::{Error, Result};

/// The launch parameters of the conv2d GEMM kernels (`Conv2dLaunch` in C): the
/// geometry and the tiling.
pub(crate) type Conv2dLaunch = crate::backend::cuda::launch::GemmLaunch<Conv2dGeom>;

/// The shape of one convolution call. `#[repr(C)]` so a device kernel can take
/// it as its launch parameter, field for field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct Conv2dGeom {
    pub batch: usize,
    pub in_channels: usize,
    pub in_h: usize,
    pub in_w: usize,
    pub out_channels: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

impl Conv2dGeom {
    pub fn out_h(&self) -> usize {
        (self.in_h + 2 * self.padding - self.kernel) / self.stride + 1
    }
    pub fn out_w(&self) -> usize {
        (self.in_w + 2 * self.padding - self.kernel) / self.stride + 1
    }
    /// Elements of one input image, `C·H·W`.
    pub fn in_image_len(&self) -> usize {
        self.in_channels * self.in_h * self.in_w
    }
    /// Elements of one output image, `O·OH·OW`.
    pub fn out_image_len(&self) -> usize {
        self.out_channels * self.out_h() * self.out_w()
    }
    /// Rows of the im2col matrix, `C·K·K` (the GEMM's inner dimension).
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.kernel * self.kernel
    }
    pub fn weight_len(&self) -> usize {
        self.out_channels * self.patch_len()
    }

    /// Rejects geometries no kernel can run.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: &str| {
            Err(Error::InvalidArgument {
                op: "conv2d",
                reason: reason.into(),
            })
        };
        if self.kernel == 0 || self.stride == 0 {
            return bad("kernel size and stride must be at least 1");
        }
        if self.in_channels == 0 || self.out_channels == 0 {
            return bad("channel counts must be at least 1");
        }
        if self.in_h + 2 * self.padding < self.kernel || self.in_w + 2 * self.padding < self.kernel
        {
            return bad("the kernel is larger than the padded input");
        }
        Ok(())
    }

    /// Validates the geometry; the lengths of every buffer of a call.
    pub(crate) fn lens(&self) -> Result<LayerLens> {
        self.validate()?;
        Ok(LayerLens {
            op: "conv2d",
            x: self.batch * self.in_image_len(),
            y: self.batch * self.out_image_len(),
            weight: self.weight_len(),
            bias: self.out_channels,
        })
    }
}
