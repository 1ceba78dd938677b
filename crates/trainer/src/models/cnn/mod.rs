//! `CNN_MNIST`, the network of the classic PyTorch example:
//!
//! ```text
//! conv1 1→32 3x3 · relu · conv2 32→64 3x3 · relu · maxpool 2x2 · dropout 0.25
//! · flatten · fc1 9216→128 · relu · dropout 0.5 · fc2 128→10
//! ```
//!
//! Each layer's geometry is written once, below; the parameter shapes and
//! the activation sizes are derived from it. Parameters are one flat buffer
//! laid out exactly as PyTorch's `state_dict()` (names, shapes, order), so
//! checkpoints map one to one. The network is a chain of four segments at
//! its natural cuts (`segments.rs`), which a pipeline may split between
//! stages; the whole model runs them in turn.

use std::ops::Range;
use std::sync::LazyLock;

use core_tensor::ops::{Conv2dGeom, Dropout, LinearGeom, ParamAt, PoolGeom};
use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

mod data;
mod entry;
mod segments;
mod trainer;

pub use data::{DeviceSplit, HostSplit};
pub use entry::{CnnFlags, ENTRY, NAME};
pub use segments::Inner;
pub use trainer::StageSpec;

use crate::model::layered::{self, Chain};
use crate::model::{
    DropoutRates, DropoutSeed, GradsReady, Metric, Mode, Model, pytorch_default_init,
};

/// Every buffer one pass of the whole network over a batch needs.
pub type Activations<B> = Chain<B, Inner<B>, u8>;

/// Values in the flat parameter buffer.
pub const PARAM_COUNT: usize = 1_199_882;
/// Side of the square input image.
pub const IMAGE_SIDE: usize = 28;
pub const CLASSES: usize = 10;

/// The layers at batch size 1 (each pass sets its own batch).
const CONV1: Conv2dGeom = Conv2dGeom {
    batch: 1,
    in_channels: 1,
    in_h: IMAGE_SIDE,
    in_w: IMAGE_SIDE,
    out_channels: 32,
    kernel: 3,
    stride: 1,
    padding: 0,
};
const CONV2: Conv2dGeom = Conv2dGeom {
    batch: 1,
    in_channels: CONV1.out_channels,
    in_h: IMAGE_SIDE - 2,
    in_w: IMAGE_SIDE - 2,
    out_channels: 64,
    kernel: 3,
    stride: 1,
    padding: 0,
};
const POOL: PoolGeom = PoolGeom {
    batch: 1,
    channels: CONV2.out_channels,
    in_h: IMAGE_SIDE - 4,
    in_w: IMAGE_SIDE - 4,
};
const FC1: LinearGeom = LinearGeom {
    batch: 1,
    in_features: POOL.channels * (POOL.in_h / 2) * (POOL.in_w / 2),
    out_features: 128,
};
const FC2: LinearGeom = LinearGeom {
    batch: 1,
    in_features: FC1.out_features,
    out_features: CLASSES,
};

/// The parameters' `state_dict` layout: `(name, shape, fan_in)` per tensor.
fn param_specs() -> [(&'static str, Vec<usize>, usize); 8] {
    let conv_w = |g: Conv2dGeom| vec![g.out_channels, g.in_channels, g.kernel, g.kernel];
    let fc_w = |g: LinearGeom| vec![g.out_features, g.in_features];
    [
        ("conv1.weight", conv_w(CONV1), CONV1.patch_len()),
        ("conv1.bias", vec![CONV1.out_channels], CONV1.patch_len()),
        ("conv2.weight", conv_w(CONV2), CONV2.patch_len()),
        ("conv2.bias", vec![CONV2.out_channels], CONV2.patch_len()),
        ("fc1.weight", fc_w(FC1), FC1.in_features),
        ("fc1.bias", vec![FC1.out_features], FC1.in_features),
        ("fc2.weight", fc_w(FC2), FC2.in_features),
        ("fc2.bias", vec![FC2.out_features], FC2.in_features),
    ]
}

/// The CNN's parameter layout, built once per process.
pub fn cnn_layout() -> &'static FlatLayout {
    static LAYOUT: LazyLock<FlatLayout> = LazyLock::new(|| {
        let specs = param_specs()
            .into_iter()
            .map(|(name, shape, _)| ParamSpec::new(name, &shape))
            .collect();
        FlatLayout::new(specs).expect("parameter names are distinct")
    });
    &LAYOUT
}

/// The network: where each layer's parameters live, and its dropout rates.
#[derive(Clone, Debug)]
pub struct CnnMnist {
    conv1: ParamAt,
    conv2: ParamAt,
    fc1: ParamAt,
    fc2: ParamAt,
    dropout: DropoutRates,
}

impl CnnMnist {
    pub fn new(dropout: DropoutRates) -> Self {
        let at = |layer: &str| layered::layer_at(cnn_layout(), layer);
        Self {
            conv1: at("conv1"),
            conv2: at("conv2"),
            fc1: at("fc1"),
            fc2: at("fc2"),
            dropout,
        }
    }

    pub fn dropout(&self) -> DropoutRates {
        self.dropout
    }

    /// The parameter layout (see [`cnn_layout`]).
    pub fn layout(&self) -> &'static FlatLayout {
        cnn_layout()
    }

    /// PyTorch's default distributions (see [`pytorch_default_init`]).
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let tensors = param_specs().map(|(_, shape, fan_in)| (shape.iter().product(), fan_in));
        pytorch_default_init(seed, &tensors)
    }

    /// The network over a buffer holding only `part` of the flat
    /// parameters (a pipeline stage's, with its gradients): see
    /// [`layered::param_within`].
    fn shifted(&self, part: Range<usize>) -> Self {
        let shift = |at: &ParamAt| layered::param_within(at, &part);
        Self {
            conv1: shift(&self.conv1),
            conv2: shift(&self.conv2),
            fc1: shift(&self.fc1),
            fc2: shift(&self.fc2),
            dropout: self.dropout,
        }
    }

    /// The two dropout layers of one training step, `(after the pool,
    /// after fc1)`: their rates, and independent streams from the step's
    /// seed.
    fn dropouts(&self, step: DropoutSeed) -> (Dropout, Dropout) {
        let layer = |p, stream, features| Dropout {
            p,
            seed: step.layer(stream, features),
        };
        (
            layer(self.dropout.pool, 1, POOL.output_len()),
            layer(self.dropout.hidden, 2, FC1.out_features),
        )
    }

    /// The dropout layers of a forward pass: none when evaluating.
    fn dropouts_in(&self, mode: Mode) -> (Dropout, Dropout) {
        match mode {
            Mode::Train { dropout_seed } => self.dropouts(dropout_seed),
            Mode::Eval => (Dropout::OFF, Dropout::OFF),
        }
    }
}

/// `geom` at batch size `batch`.
fn conv(geom: Conv2dGeom, batch: usize) -> Conv2dGeom {
    Conv2dGeom { batch, ..geom }
}
fn linear(geom: LinearGeom, batch: usize) -> LinearGeom {
    LinearGeom { batch, ..geom }
}
fn pool(batch: usize) -> PoolGeom {
    PoolGeom { batch, ..POOL }
}

impl<B: Ops> Model<B> for CnnMnist {
    type Buffers = Activations<B>;

    fn kind(&self) -> &'static str {
        NAME
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    fn layout(&self) -> &FlatLayout {
        cnn_layout()
    }

    fn init_params(&self, seed: u64) -> Vec<f32> {
        CnnMnist::init_params(self, seed)
    }

    fn buffers(&self, backend: &B, batch: usize, train: bool) -> Result<Activations<B>> {
        Chain::new(self, backend, batch, train)
    }

    fn forward(
        &self,
        b: &B,
        act: &mut Activations<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        layered::forward(self, b, act, params, mode)
    }

    fn metric_sum(&self, b: &B, act: &Activations<B>, correct: &mut B::Storage<f32>) -> Result<()> {
        layered::metric_sum(self, b, act, correct)
    }

    fn loss(
        &self,
        b: &B,
        act: &mut Activations<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        layered::loss(self, b, act, loss_sum)
    }

    fn backward(
        &self,
        b: &B,
        act: &mut Activations<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: DropoutSeed,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        layered::backward(self, b, act, (params, grads), dropout_seed, hook)
    }
}

#[cfg(test)]
mod exact_tests;
#[cfg(test)]
mod tests;
