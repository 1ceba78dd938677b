//! 2x2 max-pooling with stride 2 (odd trailing rows/columns are dropped, as
//! in PyTorch). Backward routes each gradient to the window's argmax, found
//! again from the input: the first maximum in row-major window order, NaN
//! winning, exactly PyTorch's rule, so no index buffer is stored.
//!
//! An [`Epilogue`] can apply ReLU and dropout to the pooled values in the
//! same pass (and their gradients' masks in the backward one): CNN_MNIST's
//! ReLU commutes with the pool, and dropout follows it.

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::error::check_len;
use crate::ops::Dropout;
use crate::{Backend, Error, Result};

/// What the pooling kernels apply to each pooled value after the maximum.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Epilogue {
    /// The maximum itself.
    Identity,
    /// ReLU, then the dropout (`Dropout::OFF` for ReLU alone), as
    /// [`crate::ops::ReluKernel`] computes them.
    ReluDropout(Dropout),
}

impl Epilogue {
    /// Whether ReLU runs, and the dropout after it.
    pub(crate) fn parts(self) -> Result<(bool, Dropout)> {
        match self {
            Self::Identity => Ok((false, Dropout::OFF)),
            Self::ReluDropout(d) => d.check().map(|()| (true, d)),
        }
    }
}

/// The input shape `[batch, channels, in_h, in_w]` of a pooling call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct PoolGeom {
    pub batch: usize,
    pub channels: usize,
    pub in_h: usize,
    pub in_w: usize,
}

impl PoolGeom {
    pub fn out_h(&self) -> usize {
        self.in_h / 2
    }
    pub fn out_w(&self) -> usize {
        self.in_w / 2
    }
    pub fn input_len(&self) -> usize {
        self.batch * self.channels * self.in_h * self.in_w
    }
    pub fn output_len(&self) -> usize {
        self.batch * self.channels * self.out_h() * self.out_w()
    }

    pub(crate) fn check<B: Backend>(&self, x: &B::Storage<f32>, y: &B::Storage<f32>) -> Result<()> {
        self.check_window()?;
        check_len("maxpool2d", "x", B::len(x), self.input_len())?;
        check_len("maxpool2d", "y", B::len(y), self.output_len())
    }

    /// Refuses planes that hold no window.
    pub(crate) fn check_window(&self) -> Result<()> {
        if self.in_h < 2 || self.in_w < 2 {
            // PyTorch refuses it too ("output size is too small").
            return Err(Error::InvalidArgument {
                op: "maxpool2d",
                reason: format!(
                    "a {}x{} plane holds no 2x2 window; pool planes of at least 2x2",
                    self.in_h, self.in_w
                ),
            });
        }
        Ok(())
    }
}

/// Max-pooling kernels.
pub trait MaxPool2dKernel: Backend {
    /// `y = then(max over each window of x)`.
    fn maxpool2d_fwd(
        &self,
        geom: &PoolGeom,
        then: Epilogue,
        x: &Self::Storage<f32>,
        y: &mut Self::Storage<f32>,
    ) -> Result<()>;
    /// Overwrites `dx` with `dy`, through `then`'s masks (ReLU's by the
    /// forward output `y`, dropout's), routed to each window's argmax in
    /// `x`. With [`Epilogue::Identity`], `y` is not read.
    fn maxpool2d_bwd(
        &self,
        geom: &PoolGeom,
        then: Epilogue,
        x: &Self::Storage<f32>,
        y: &Self::Storage<f32>,
        dy: &Self::Storage<f32>,
        dx: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
