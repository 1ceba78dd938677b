//! One folder per op: `mod.rs` holds the op's geometry and the kernel trait
//! every backend implements, `cpu.rs` the CPU kernel, `tests.rs` its checks.
//!
//! All kernels overwrite their outputs (gradients included: there is no
//! accumulation across calls to forget to zero), except the two metric
//! accumulators `loss_sum` and `correct`, which add to what they hold,
//! `rows_scatter`, which writes only the rows it names,
//! `embedding_bwd_add`, which adds into the rows it names (for a caller
//! that keeps the table's gradient zero), and `accumulate`, which adds a
//! micro-batch's gradients into the step's sum.

pub mod accumulate;
pub mod accuracy;
pub mod adam;
pub mod conv2d;
pub mod conv2d_pool;
mod conv2d_relu;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod finite;
pub mod gather;
pub mod half_cast;
pub mod linear;
mod linear_relu;
pub mod maxpool2d;
pub mod mse;
pub mod offset;
pub mod relu;
pub mod rows;
pub mod sgd;

pub(crate) mod gemm_layer;
mod kernels;

use std::ops::Range;

pub use accumulate::{AccumulateKernel, SumInto};
pub use accuracy::AccuracyKernel;
pub use adam::{AdamConfig, AdamKernel, AdamScalars, SparseAdamScalars};
pub use conv2d::Conv2dGeom;
pub use conv2d_pool::Conv2dPoolKernel;
pub use cross_entropy::{ClassGeom, CrossEntropyKernel};
pub use dropout::Dropout;
pub use embedding::{EmbeddingGeom, EmbeddingKernel};
pub use finite::{FiniteKernel, GUARD_CLEAR, GUARD_LEN, GuardState};
pub use gather::GatherKernel;
pub use half_cast::{Half, HalfCastKernel};
pub use kernels::kernel_modules;
pub use linear::LinearGeom;
pub use maxpool2d::{Epilogue, MaxPool2dKernel, PoolGeom};
pub use mse::{MseGeom, MseKernel};
pub use offset::{OffsetGeom, OffsetKernel};
pub use relu::ReluKernel;
pub use rows::{RowsGeom, RowsKernel};
pub use sgd::SgdKernel;

use crate::error::check_len;
use crate::{Backend, Result};

/// Declares `Ops`, the sum of the op traits, and its blanket impl.
macro_rules! all_ops {
    ($($kernel:path),* $(,)?) => {
        /// Every op: what a model needs from a device.
        pub trait Ops: Backend $(+ $kernel)* {}

        impl<B> Ops for B where B: Backend $(+ $kernel)* {}
    };
}

all_ops!(
    AccumulateKernel,
    AccuracyKernel,
    AdamKernel,
    LayerKernel<Conv2dGeom>,
    LayerKernel<LinearGeom>,
    Conv2dPoolKernel,
    CrossEntropyKernel,
    EmbeddingKernel,
    FiniteKernel,
    GatherKernel,
    HalfCastKernel,
    MaxPool2dKernel,
    MseKernel,
    OffsetKernel,
    ReluKernel,
    RowsKernel,
    SgdKernel,
);

/// The kernels of a layer with a weight and a bias (conv2d, linear), one
/// trait over the layer's geometry `G`: the geometry says which layer it
/// is, and on the GPU both are the same three GEMMs and a bias reduction
/// (`gemm_layer.rs`, one impl for every `GemmLayer`). The layer followed by
/// ReLU and dropout is one call too: a device with a fused kernel for it
/// runs that (`conv2d_relu`, `linear_relu`), any other the layer then
/// [`ReluKernel`], with the same bits.
pub trait LayerKernel<G>: ReluKernel {
    /// `y = layer(x; W, b)`, with `W` and `b` read from `params` at `at`:
    /// a convolution, or `y = x·Wᵀ + b` with PyTorch's `[out, in]` weight.
    fn layer_fwd(
        &self,
        geom: &G,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        y: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// Writes `dW` and `db` into `grads` at `at`, and `dx` when asked for
    /// (the first layer of a network has no use for its input gradient).
    #[allow(clippy::too_many_arguments)]
    fn layer_bwd(
        &self,
        geom: &G,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        dy: &Self::Storage<f32>,
        grads: &mut Self::Storage<f32>,
        dx: Option<&mut Self::Storage<f32>>,
    ) -> Result<()>;

    /// `y = dropout(max(layer(x; W, b), 0))`, `dropout`'s mask by the
    /// element index of `y` (NaN and -0 pass the ReLU, as
    /// [`ReluKernel::relu_fwd`] leaves them).
    fn layer_relu_fwd(
        &self,
        geom: &G,
        dropout: Dropout,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        y: &mut Self::Storage<f32>,
    ) -> Result<()> {
        self.layer_fwd(geom, x, params, at, y)?;
        self.relu_fwd(dropout, y)
    }

    /// The backward pass of [`Self::layer_relu_fwd`], given `saved = (y,
    /// dy)`, its output and that output's gradient: `dy` masked in place
    /// (`dy = dropout(dy) · [y > 0]`, as [`ReluKernel::relu_bwd`]), then
    /// [`Self::layer_bwd`] on it.
    #[allow(clippy::too_many_arguments)]
    fn layer_relu_bwd(
        &self,
        geom: &G,
        dropout: Dropout,
        x: &Self::Storage<f32>,
        params: &Self::Storage<f32>,
        at: &ParamAt,
        (y, dy): (&Self::Storage<f32>, &mut Self::Storage<f32>),
        grads: &mut Self::Storage<f32>,
        dx: Option<&mut Self::Storage<f32>>,
    ) -> Result<()> {
        self.relu_bwd(dropout, y, dy)?;
        self.layer_bwd(geom, x, params, at, dy, grads, dx)
    }
}

/// Where a layer's weight and bias sit in the flat parameter (and gradient)
/// buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamAt {
    pub weight: Range<usize>,
    pub bias: Range<usize>,
}

impl ParamAt {
    /// Checks that the ranges have the lengths the layer needs and fit in a
    /// flat buffer of `flat_len` elements.
    pub(crate) fn check(
        &self,
        op: &'static str,
        weight_len: usize,
        bias_len: usize,
        flat_len: usize,
    ) -> Result<()> {
        check_len(op, "weight", self.weight.len(), weight_len)?;
        check_len(op, "bias", self.bias.len(), bias_len)?;
        if self.weight.end > flat_len || self.bias.end > flat_len {
            return Err(crate::Error::InvalidArgument {
                op,
                reason: format!(
                    "parameter ranges {self:?} exceed the flat buffer of {flat_len} elements"
                ),
            });
        }
        Ok(())
    }
}

/// The buffer lengths of one call of a layer with a weight and a bias
/// (conv2d, linear), from its geometry: what every backend checks first.
pub(crate) struct LayerLens {
    pub op: &'static str,
    pub x: usize,
    pub y: usize,
    pub weight: usize,
    pub bias: usize,
}

impl LayerLens {
    /// Checks the input, the output (or its gradient) and the parameters.
    pub(crate) fn check<B: Backend>(
        &self,
        x: &B::Storage<f32>,
        params: &B::Storage<f32>,
        at: &ParamAt,
        y_or_dy: &B::Storage<f32>,
    ) -> Result<()> {
        check_len(self.op, "x", B::len(x), self.x)?;
        check_len(self.op, "y", B::len(y_or_dy), self.y)?;
        at.check(self.op, self.weight, self.bias, B::len(params))
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
        at.check(self.op, self.weight, self.bias, B::len(grads))?;
        match dx {
            Some(dx) => check_len(self.op, "dx", B::len(dx), B::len(x)),
            None => Ok(()),
        }
    }
}
