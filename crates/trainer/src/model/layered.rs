//! A model a pipeline can cut: a classifier made of a chain of segments
//! (its natural cuts), each reading the activations the one before wrote.
//! Segment 0 reads the batch's inputs (`width(0)` values a sample, which
//! its data set fills); the last writes the logits over `width(segments)`
//! classes, which the cross-entropy scores against the batch's labels.
//!
//! The whole model runs the segments in turn over a [`Chain`] of buffers
//! ([`forward`], [`backward`]: the same kernels in the same order as any
//! one pass over the network, so the same bits); a pipeline stage runs a
//! contiguous run of them over its own (`crate::pipeline`).

use std::ops::Range;

use anyhow::Context;
use core_tensor::ops::ClassGeom;
use core_tensor::{Ops, Result};

use super::{DropoutSeed, GradsReady, Mode, Model};

/// What a training buffer asks of buffers built for evaluation.
const TRAINING_ONLY: &str = "backward needs buffers built for training";

/// The capability of a model a pipeline can cut.
pub trait Layered<B: Ops>: Model<B> + Sized {
    /// One segment's own buffers for a batch: what lies inside it (and for
    /// training the gradients there), none of the cuts'.
    type Acts;

    /// Its segments, in order (at least one).
    fn segments(&self) -> usize;

    /// The parameters segment `s` trains; consecutive segments' ranges are
    /// consecutive in the flat buffer.
    fn segment_params(&self, s: usize) -> Range<usize>;

    /// Values per sample crossing cut `cut`: 0 the inputs, `segments()`
    /// the logits, `k` in between what segment `k - 1` writes.
    fn width(&self, cut: usize) -> usize;

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

/// The classes of a batch of `batch` samples of a model with `classes`
/// logits each.
pub fn classes(batch: usize, classes: usize) -> ClassGeom {
    ClassGeom { batch, classes }
}

/// Buffers a batch of a classifier's data is gathered into: consecutive
/// parts of the batch (a pipeline's micro-batches, or the whole batch),
/// each with the inputs its stage reads (the first stage only the inputs,
/// the last only the labels).
pub trait BatchInputs<B: Ops> {
    /// The parts, in the batch's order.
    fn parts(&mut self) -> Vec<InputPart<'_, B>>;
}

/// One part of a batch's inputs (see [`BatchInputs`]); at least one of
/// the two buffers.
pub struct InputPart<'a, B: Ops> {
    pub samples: usize,
    /// `samples` inputs of `width(0)` values.
    pub inputs: Option<&'a mut B::Storage<f32>>,
    pub labels: Option<&'a mut B::Storage<u8>>,
}

/// Every buffer of a whole layered model for a batch.
pub struct Chain<B: Ops, A> {
    pub batch: usize,
    /// Cut `k`: the inputs (0), what segment `k - 1` wrote, the logits.
    pub cuts: Vec<B::Storage<f32>>,
    /// The gradient of cut `k + 1`, for training; `None` for evaluation.
    pub dcuts: Option<Vec<B::Storage<f32>>>,
    /// Each segment's own buffers.
    pub acts: Vec<A>,
    pub labels: B::Storage<u8>,
}

impl<B: Ops, A> Chain<B, A> {
    /// `model`'s buffers for `batch` samples, with gradients when `train`.
    pub fn new<M: Layered<B, Acts = A>>(
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
            labels: b.zeros(batch)?,
        })
    }

    fn logits(&self) -> &B::Storage<f32> {
        self.cuts.last().expect("a chain has its logits")
    }
}

/// The whole model reads both, over the whole batch.
impl<B: Ops, A> BatchInputs<B> for Chain<B, A> {
    fn parts(&mut self) -> Vec<InputPart<'_, B>> {
        vec![InputPart {
            samples: self.batch,
            inputs: Some(&mut self.cuts[0]),
            labels: Some(&mut self.labels),
        }]
    }
}

/// Forward of every segment in turn, from the inputs to the logits.
pub fn forward<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &mut Chain<B, M::Acts>,
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

/// Adds the batch's correct predictions to `correct`.
pub fn count_correct<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &Chain<B, M::Acts>,
    correct: &mut B::Storage<f32>,
) -> Result<()> {
    let geom = classes(chain.batch, model.width(model.segments()));
    b.count_correct(&geom, chain.logits(), &chain.labels, correct)
}

/// The cross-entropy of the logits: its sum added to `loss_sum`, its
/// gradient written for backward.
pub fn loss<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &mut Chain<B, M::Acts>,
    loss_sum: &mut B::Storage<f32>,
) -> anyhow::Result<()> {
    let geom = classes(chain.batch, model.width(model.segments()));
    let dcuts = chain.dcuts.as_mut().context(TRAINING_ONLY)?;
    let dlogits = dcuts.last_mut().context("a chain has its logits")?;
    let logits = chain.cuts.last().context("a chain has its logits")?;
    Ok(b.cross_entropy_fwd_bwd(&geom, logits, &chain.labels, dlogits, loss_sum)?)
}

/// Backward of every segment, last first, telling `hook` as each
/// segment's gradients are final.
pub fn backward<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    chain: &mut Chain<B, M::Acts>,
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
