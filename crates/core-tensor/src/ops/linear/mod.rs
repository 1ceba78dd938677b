//! Fully connected layer `y = x·Wᵀ + b` with PyTorch's `[out, in]` weight.

mod cpu;
mod cuda;
#[cfg(test)]
mod tests;

use super::ParamAt;
use crate::error::check_len;
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
    pub(crate) fn check<B: Backend>(
        &self,
        x: &B::Storage<f32>,
        params: &B::Storage<f32>,
        at: &ParamAt,
        y_or_dy: &B::Storage<f32>,
    ) -> Result<()> {
        check_len("linear", "x", B::len(x), self.batch * self.in_features)?;
        check_len(
            "linear",
            "y",
            B::len(y_or_dy),
            self.batch * self.out_features,
        )?;
        at.check(
            "linear",
            self.in_features * self.out_features,
            self.out_features,
            B::len(params),
        )
    }

    /// [`Self::check`] for a backward call, plus the gradient buffer and
    /// the optional input gradient.
    pub(crate) fn check_bwd<B: Backend>(
        &self,
        x: &B::Storage<f32>,
        params: &B::Storage<f32>,
        at: &ParamAt,
        dy: &B::Storage<f32>,
        grads: &B::Storage<f32>,
        dx: Option<&B::Storage<f32>>,
    ) -> Result<()> {
        self.check::<B>(x, params, at, dy)?;
        at.check(
            "linear",
            self.in_features * self.out_features,
            self.out_features,
            B::len(grads),
        )?;
        match dx {
            Some(dx) => check_len("linear", "dx", B::len(dx), B::len(x)),
            None => Ok(()),
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
