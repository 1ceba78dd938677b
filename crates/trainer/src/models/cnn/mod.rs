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
//! checkpoints map one to one.

use std::ops::Range;
use std::sync::LazyLock;

use core_tensor::ops::{ClassGeom, Conv2dGeom, Dropout, Epilogue, LinearGeom, ParamAt, PoolGeom};
use core_tensor::{FlatLayout, Ops, ParamSpec, Result, rng};

mod buffers;
mod data;
mod entry;
mod trainer;

pub use buffers::{Activations, Cut, Features, Head, HeadGrads};
pub(crate) use buffers::{FeatureGrads, GradAndPooled, for_training};
pub use data::{BatchInputs, DeviceSplit, HostSplit, InputPart};
pub use entry::{CnnFlags, ENTRY, NAME};

use crate::model::{DropoutRates, GradsReady, Metric, Mode, Model, pytorch_default_init};

/// Values in the flat parameter buffer.
pub const PARAM_COUNT: usize = 1_199_882;
/// Side of the square input image.
pub const IMAGE_SIDE: usize = 28;
pub const CLASSES: usize = 10;

/// The layers at batch size 1 (each pass sets its own batch).
pub(super) const CONV1: Conv2dGeom = Conv2dGeom {
    batch: 1,
    in_channels: 1,
    in_h: IMAGE_SIDE,
    in_w: IMAGE_SIDE,
    out_channels: 32,
    kernel: 3,
    stride: 1,
    padding: 0,
};
pub(super) const CONV2: Conv2dGeom = Conv2dGeom {
    batch: 1,
    in_channels: CONV1.out_channels,
    in_h: IMAGE_SIDE - 2,
    in_w: IMAGE_SIDE - 2,
    out_channels: 64,
    kernel: 3,
    stride: 1,
    padding: 0,
};
pub(super) const POOL: PoolGeom = PoolGeom {
    batch: 1,
    channels: CONV2.out_channels,
    in_h: IMAGE_SIDE - 4,
    in_w: IMAGE_SIDE - 4,
};
pub(super) const FC1: LinearGeom = LinearGeom {
    batch: 1,
    in_features: POOL.channels * (POOL.in_h / 2) * (POOL.in_w / 2),
    out_features: 128,
};
pub(super) const FC2: LinearGeom = LinearGeom {
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
        let at = |layer: &str| {
            let range = |part: &str| {
                cnn_layout()
                    .range(&format!("{layer}.{part}"))
                    .expect("declared in param_specs")
            };
            ParamAt {
                weight: range("weight"),
                bias: range("bias"),
            }
        };
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
    /// parameters (a pipeline stage's, with its gradients): the layers
    /// inside `part` address it at offsets less `part.start`, the others
    /// get empty ranges, which every kernel refuses.
    pub(crate) fn within(&self, part: Range<usize>) -> Self {
        let shift = |at: &ParamAt| {
            let inside = |r: &Range<usize>| part.start <= r.start && r.end <= part.end;
            let by = |r: &Range<usize>| r.start - part.start..r.end - part.start;
            match inside(&at.weight) && inside(&at.bias) {
                true => ParamAt {
                    weight: by(&at.weight),
                    bias: by(&at.bias),
                },
                false => ParamAt {
                    weight: 0..0,
                    bias: 0..0,
                },
            }
        };
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
    fn dropouts(&self, step_seed: u64) -> (Dropout, Dropout) {
        let layer = |p, stream| Dropout {
            p,
            seed: rng::derive_seed(step_seed, &[stream]),
        };
        (layer(self.dropout.pool, 1), layer(self.dropout.hidden, 2))
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
pub(crate) fn classes(batch: usize) -> ClassGeom {
    ClassGeom {
        batch,
        classes: CLASSES,
    }
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
        Activations::new(backend, batch, train)
    }

    fn forward(
        &self,
        b: &B,
        act: &mut Activations<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        self.forward_features(b, &mut act.features, &mut act.cut, params, mode)?;
        self.forward_head(b, &act.cut, &mut act.head, params, mode)
    }

    fn metric_sum(&self, b: &B, act: &Activations<B>, correct: &mut B::Storage<f32>) -> Result<()> {
        act.head.count_correct(b, correct)
    }

    fn loss(
        &self,
        b: &B,
        act: &mut Activations<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        act.head.loss(b, loss_sum)
    }

    fn backward(
        &self,
        b: &B,
        act: &mut Activations<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: u64,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let Activations {
            features,
            cut,
            head,
        } = act;
        let step = Backward {
            params,
            dropout_seed,
        };
        self.backward_head(b, cut, head, step, grads, hook)?;
        self.backward_features(b, features, cut, step, grads, hook)
    }
}

/// What a backward pass reads besides the activations: the parameters and
/// the step's dropout seed.
pub(crate) struct Backward<'a, B: Ops> {
    pub params: &'a B::Storage<f32>,
    pub dropout_seed: u64,
}

impl<B: Ops> Clone for Backward<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B: Ops> Copy for Backward<'_, B> {}

/// The network in two parts, for pipeline stages: the features (the
/// convolution stack, up to the pooled and dropped-out activations in the
/// [`Cut`]) and the head (the fully connected stack, from the cut to the
/// logits). [`Model::forward`] and [`Model::backward`] are the two in
/// sequence. Each part reads and writes its own buffers and the cut only.
impl CnnMnist {
    /// Forward from `f.x` to `cut.pooled`.
    pub(crate) fn forward_features<B: Ops>(
        &self,
        b: &B,
        f: &mut Features<B>,
        cut: &mut Cut<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        let n = f.batch;
        b.conv2d_fwd(&conv(CONV1, n), &f.x, params, &self.conv1, &mut f.a1)?;
        b.relu_fwd(Dropout::OFF, &mut f.a1)?;
        b.conv2d_fwd(&conv(CONV2, n), &f.a1, params, &self.conv2, &mut f.a2)?;
        // ReLU after the pool, on a quarter of the values, in the pool's
        // epilogue with the dropout: max-pooling and ReLU commute (both keep
        // the largest value, or zero), and in backward the pool routes each
        // gradient to the window's first maximum of conv2's output, which is
        // that of its ReLU wherever the gradient survives the ReLU. So the
        // bits are the model's.
        let then = Epilogue::ReluDropout(self.dropouts_in(mode).0);
        b.maxpool2d_fwd(&pool(n), then, &f.a2, &mut cut.pooled)
    }

    /// Forward from `cut.pooled` to `h.logits`.
    pub(crate) fn forward_head<B: Ops>(
        &self,
        b: &B,
        cut: &Cut<B>,
        h: &mut Head<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        let n = h.batch;
        let pooled = &cut.pooled;
        b.linear_fwd(&linear(FC1, n), pooled, params, &self.fc1, &mut h.hidden)?;
        b.relu_fwd(self.dropouts_in(mode).1, &mut h.hidden)?;
        b.linear_fwd(&linear(FC2, n), &h.hidden, params, &self.fc2, &mut h.logits)
    }

    /// Backward from the loss gradient to the pooled activations' gradient
    /// (`cut`'s, before the pool dropout), writing the head's gradients.
    /// The ReLU masks read the post-dropout activations: where dropout
    /// zeroed a unit its gradient is zero either way, elsewhere the sign is
    /// unchanged.
    pub(crate) fn backward_head<B: Ops>(
        &self,
        b: &B,
        cut: &mut Cut<B>,
        h: &mut Head<B>,
        step: Backward<'_, B>,
        grads: &mut B::Storage<f32>,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let (n, params) = (h.batch, step.params);
        let (_, hidden) = self.dropouts(step.dropout_seed);
        let g = for_training(&mut h.grads)?;
        b.linear_bwd(
            &linear(FC2, n),
            &h.hidden,
            params,
            &self.fc2,
            &g.dlogits,
            grads,
            Some(&mut g.dhidden),
        )?;
        hook.ready(b, grads, self.fc2.weight.start)?;
        b.relu_bwd(hidden, &h.hidden, &mut g.dhidden)?;
        let dpooled = for_training(&mut cut.dpooled)?;
        b.linear_bwd(
            &linear(FC1, n),
            &cut.pooled,
            params,
            &self.fc1,
            &g.dhidden,
            grads,
            Some(dpooled),
        )?;
        hook.ready(b, grads, self.fc1.weight.start)
    }

    /// Backward from `cut`'s gradient (as the head left it) to the input,
    /// writing the features' gradients.
    pub(crate) fn backward_features<B: Ops>(
        &self,
        b: &B,
        f: &mut Features<B>,
        cut: &mut Cut<B>,
        step: Backward<'_, B>,
        grads: &mut B::Storage<f32>,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let (n, params) = (f.batch, step.params);
        let then = Epilogue::ReluDropout(self.dropouts(step.dropout_seed).0);
        let (da1, da2) = for_training(&mut f.grads)?;
        let dpooled = for_training(&mut cut.dpooled)?;
        // The ReLU mask reads the post-dropout pool, as the head's does.
        b.maxpool2d_bwd(&pool(n), then, &f.a2, &cut.pooled, dpooled, da2)?;
        b.conv2d_bwd(
            &conv(CONV2, n),
            &f.a1,
            params,
            &self.conv2,
            da2,
            grads,
            Some(da1),
        )?;
        hook.ready(b, grads, self.conv2.weight.start)?;
        b.relu_bwd(Dropout::OFF, &f.a1, da1)?;
        b.conv2d_bwd(&conv(CONV1, n), &f.x, params, &self.conv1, da1, grads, None)?;
        hook.ready(b, grads, self.conv1.weight.start)
    }
}

#[cfg(test)]
mod tests;
