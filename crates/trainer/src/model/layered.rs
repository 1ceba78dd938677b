//! A model a pipeline can cut: a chain of segments (its natural cuts),
//! each reading the activations the one before wrote. Segment 0 reads the
//! batch's inputs (`width(0)` values a sample, which its data set fills);
//! the last writes the outputs (`width(segments)` values a sample), which
//! the model's loss and metric score against the batch's targets
//! ([`Layered::Target`]: a classifier's labels, the CNN's; a regression's
//! values, the toy's).
//!
//! The whole model runs the segments in turn over a [`Chain`] of buffers
//! ([`forward`], [`backward`]: the same kernels in the same order as any
//! one pass over the network, so the same bits); a pipeline stage runs a
//! contiguous run of them over its own (`crate::pipeline`).

use std::ops::Range;

use anyhow::Context;
use core_tensor::ops::ParamAt;
use core_tensor::{Elem, FlatLayout, Ops, Result};

use super::{DropoutSeed, GradsReady, Mode, Model};

/// What a training buffer asks of buffers built for evaluation.
const TRAINING_ONLY: &str = "backward needs buffers built for training";

/// The capability of a model a pipeline can cut.
pub trait Layered<B: Ops>: Model<B> + Sized {
    /// One segment's own buffers for a batch: what lies inside it (and for
    /// training the gradients there), none of the cuts'.
    type Acts;

    /// What a sample's outputs are scored against: a class (`u8`), or
    /// values (`f32`).
    type Target: Elem;

    /// Its segments, in order (at least one).
    fn segments(&self) -> usize;

    /// The parameters segment `s` trains; consecutive segments' ranges are
    /// consecutive in the flat buffer.
    fn segment_params(&self, s: usize) -> Range<usize>;

    /// Values per sample crossing cut `cut`: 0 the inputs, `segments()`
    /// the outputs, `k` in between what segment `k - 1` writes.
    fn width(&self, cut: usize) -> usize;

    /// Values of [`Self::Target`] a sample (a class: one).
    fn target_width(&self) -> usize;

    /// The model over a buffer holding only `part` of the parameters (a
    /// stage's, and its gradients): the segments inside `part` address it
    /// at offsets less `part.start`, the others get nothing to address.
    fn within(&self, part: Range<usize>) -> Self;

    /// Segment `s`'s own buffers for `batch` samples, with gradients when
    /// `train`.
    fn acts(&self, b: &B, s: usize, batch: usize, train: bool) -> Result<Self::Acts>;

    /// Forward of `segment` `(s, batch)`: segment `s` over `batch` samples,
    /// from `x` (cut `s`)
    /// into `y` (cut `s + 1`), keeping in `acts` what backward needs.
    #[allow(clippy::too_many_arguments)]
    fn forward_segment(
        &self,
        b: &B,
        segment: (usize, usize),
        x: &B::Storage<f32>,
        y: &mut B::Storage<f32>,
        acts: &mut Self::Acts,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()>;

    /// Backward of `segment` `(s, batch)`, from `io.dy` (the
    /// gradient of its output, which it may overwrite) to `io.dx` (none for
    /// segment 0), writing its parameters' gradients into `grads`.
    /// `dropout_seed` is the forward pass's.
    #[allow(clippy::too_many_arguments)]
    fn backward_segment(
        &self,
        b: &B,
        segment: (usize, usize),
        io: Io<'_, B>,
        acts: &mut Self::Acts,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: DropoutSeed,
    ) -> Result<()>;

    /// Adds the metric of `batch` samples' outputs `y` against `target`
    /// to `sum` (a classifier's correct predictions; nothing for a model
    /// without a metric).
    fn output_metric(
        &self,
        b: &B,
        batch: usize,
        y_target: (&B::Storage<f32>, &B::Storage<Self::Target>),
        sum: &mut B::Storage<f32>,
    ) -> Result<()>;

    /// The loss of `batch` samples' outputs `y` against `target`: its sum
    /// added to `loss_sum`, its gradient written into `dy`.
    fn output_loss(
        &self,
        b: &B,
        batch: usize,
        y_target: (&B::Storage<f32>, &B::Storage<Self::Target>),
        dy: &mut B::Storage<f32>,
        loss_sum: &mut B::Storage<f32>,
    ) -> Result<()>;
}

/// What a segment's backward reads and writes besides its own buffers:
/// its input `x` and output `y` as forward left them, its output's
/// gradient `dy`, and its input's gradient `dx` to write.
pub struct Io<'a, B: Ops> {
    pub x: &'a B::Storage<f32>,
    pub y: &'a B::Storage<f32>,
    pub dy: &'a mut B::Storage<f32>,
    pub dx: Option<&'a mut B::Storage<f32>>,
}

/// Where `layer`'s parameters (`{layer}.weight`, `{layer}.bias`) lie in
/// `layout`; a model names only layers it declared.
pub fn layer_at(layout: &FlatLayout, layer: &str) -> ParamAt {
    let range = |part: &str| {
        (layout.range(&format!("{layer}.{part}")))
            .unwrap_or_else(|_| unreachable!("{layer}.{part} is declared in its model's layout"))
    };
    ParamAt {
        weight: range("weight"),
        bias: range("bias"),
    }
}

/// `at` in a buffer holding only `part` of the parameters (see
/// [`Layered::within`]): at offsets less `part.start` if inside it, else
/// empty ranges, which every kernel refuses.
pub fn param_within(at: &ParamAt, part: &Range<usize>) -> ParamAt {
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
}

/// Buffers a batch of a layered model's data is gathered into:
/// consecutive parts of the batch (a pipeline's micro-batches, or the
/// whole batch), each with what its stage reads (the first stage only the
/// inputs, the last only the targets, of `T`).
pub trait BatchInputs<B: Ops, T: Elem> {
    /// The parts, in the batch's order.
    fn parts(&mut self) -> Vec<InputPart<'_, B, T>>;
}

/// One part of a batch's inputs (see [`BatchInputs`]); at least one of
/// the two buffers.
pub struct InputPart<'a, B: Ops, T: Elem> {
    pub samples: usize,
    /// `samples` inputs of `width(0)` values.
    pub inputs: Option<&'a mut B::Storage<f32>>,
    /// `samples` targets of `target_width()` values.
    pub targets: Option<&'a mut B::Storage<T>>,
}

/// Every buffer of a whole layered model for a batch.
pub struct Chain<B: Ops, A, T: Elem> {
    pub batch: usize,
    /// Cut `k`: the inputs (0), what segment `k - 1` wrote, the outputs.
    pub cuts: Vec<B::Storage<f32>>,
    /// The gradient of cut `k + 1`, for training; `None` for evaluation.
    pub dcuts: Option<Vec<B::Storage<f32>>>,
    /// Each segment's own buffers.
    pub acts: Vec<A>,
    pub targets: B::Storage<T>,
}

impl<B: Ops, A, T: Elem> Chain<B, A, T> {
    /// `model`'s buffers for `batch` samples, with gradients when `train`.
    pub fn new<M: Layered<B, Acts = A, Target = T>>(
        model: &M,
        b: &B,
        batch: usize,
        train: bool,
    ) -> Result<Self> {
        let n = model.segments();
        let cuts = (0..=n)
            .map(|k| b.zeros(batch * model.width(k)))
            .collect::<Result<_>>()?;
        let dcuts = train
            .then(|| (1..=n).map(|k| b.zeros(batch * model.width(k))).collect())
            .transpose()?;
        Ok(Self {
            batch,
            cuts,
            dcuts,
            acts: (0..n)
                .map(|s| model.acts(b, s, batch, train))
                .collect::<Result<_>>()?,
            targets: b.zeros(batch * model.target_width())?,
        })
    }

    fn outputs(&self) -> &B::Storage<f32> {
        self.cuts.last().expect("a chain has its outputs")
    }
}

/// The whole model reads both, over the whole batch.
impl<B: Ops, A, T: Elem> BatchInputs<B, T> for Chain<B, A, T> {
    fn parts(&mut self) -> Vec<InputPart<'_, B, T>> {
        vec![InputPart {
            samples: self.batch,
            inputs: Some(&mut self.cuts[0]),
            targets: Some(&mut self.targets),
        }]
    }
}

/// A part of a batch's buffers and its positions in the epoch's order.
pub type Stretch<'a, B, T> = (Range<usize>, InputPart<'a, B, T>);

/// The parts of `buffers` for batch `step` at `positions` of the epoch's
/// order, each with its stretch of them; buffers made for another size of
/// batch are refused.
pub fn stretches<B: Ops, T: Elem>(
    buffers: &mut impl BatchInputs<B, T>,
    step: usize,
    positions: Range<usize>,
) -> anyhow::Result<Vec<Stretch<'_, B, T>>> {
    let parts = buffers.parts();
    let held: usize = parts.iter().map(|p| p.samples).sum();
    if held != positions.len() {
        anyhow::bail!(
            "batch {step} has {} samples but its buffers hold {held}: make the buffers for the batch's size",
            positions.len()
        );
    }
    let mut at = positions.start;
    Ok((parts.into_iter())
        .map(|part| {
            let stretch = at..at + part.samples;
            at = stretch.end;
            (stretch, part)
        })
        .collect())
}

/// A layered model's whole-model buffers.
pub type ChainOf<B, M> = Chain<B, <M as Layered<B>>::Acts, <M as Layered<B>>::Target>;

/// Forward of every segment in turn, from the inputs to the outputs.
pub fn forward<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &mut ChainOf<B, M>,
    params: &B::Storage<f32>,
    mode: Mode,
) -> Result<()> {
    for s in 0..model.segments() {
        let (before, after) = chain.cuts.split_at_mut(s + 1);
        let (x, y) = (&before[s], &mut after[0]);
        model.forward_segment(b, (s, chain.batch), x, y, &mut chain.acts[s], params, mode)?;
    }
    Ok(())
}

/// Adds the batch's metric to `sum` ([`Layered::output_metric`]).
pub fn metric_sum<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &ChainOf<B, M>,
    sum: &mut B::Storage<f32>,
) -> Result<()> {
    model.output_metric(b, chain.batch, (chain.outputs(), &chain.targets), sum)
}

/// The loss of the outputs: its sum added to `loss_sum`, its gradient
/// written for backward ([`Layered::output_loss`]).
pub fn loss<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &mut ChainOf<B, M>,
    loss_sum: &mut B::Storage<f32>,
) -> anyhow::Result<()> {
    let dcuts = chain.dcuts.as_mut().context(TRAINING_ONLY)?;
    let dy = dcuts.last_mut().context("a chain has its outputs")?;
    let y = chain.cuts.last().context("a chain has its outputs")?;
    Ok(model.output_loss(b, chain.batch, (y, &chain.targets), dy, loss_sum)?)
}

/// Backward of every segment, last first, telling `hook` as each
/// segment's gradients are final.
pub fn backward<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &mut ChainOf<B, M>,
    (params, grads): (&B::Storage<f32>, &mut B::Storage<f32>),
    dropout_seed: DropoutSeed,
    hook: &mut dyn GradsReady<B>,
) -> anyhow::Result<()> {
    let dcuts = chain.dcuts.as_mut().context(TRAINING_ONLY)?;
    for s in (0..model.segments()).rev() {
        // dcuts[s] is cut s + 1's gradient, dcuts[s - 1] cut s's.
        let (below, at) = dcuts.split_at_mut(s);
        let io = Io {
            x: &chain.cuts[s],
            y: &chain.cuts[s + 1],
            dy: &mut at[0],
            dx: below.last_mut(),
        };
        let acts = &mut chain.acts[s];
        model.backward_segment(b, (s, chain.batch), io, acts, params, grads, dropout_seed)?;
        hook.ready(b, grads, model.segment_params(s).start)?;
    }
    Ok(())
}
