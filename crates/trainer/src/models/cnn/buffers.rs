//! The CNN's activation buffers, sized from the layer geometry in `mod.rs`,
//! in three parts: the convolution stack's ([`Features`]), the cut where it
//! meets the fully connected stack ([`Cut`]) and the fully connected
//! stack's ([`Head`]). The whole network ([`Activations`]) holds all three;
//! a pipeline stage holds its own stack's part and the cut (see
//! `pipeline`), so that no buffer its layers never touch exists (a GPU
//! cannot allocate an empty one anyway).

use anyhow::Context;
use core_tensor::{Backend, Ops, Result};

use super::{CONV1, CONV2, FC1, FC2, classes};

/// What a use of the gradients of evaluation buffers is told.
const TRAINING_ONLY: &str = "backward needs buffers built for training";

/// The gradients `grads` holds (a part's field, borrowed alone so that its
/// other buffers stay free); an error for evaluation buffers.
pub(crate) fn for_training<T>(grads: &mut Option<T>) -> anyhow::Result<&mut T> {
    grads.as_mut().context(TRAINING_ONLY)
}

/// Every buffer one forward/backward pass of the whole network over
/// `batch` images needs, allocated once and reused step after step.
#[derive(Debug)]
pub struct Activations<B: Ops> {
    pub features: Features<B>,
    pub(crate) cut: Cut<B>,
    pub head: Head<B>,
}

/// The convolution stack's buffers: the images, both convolutions'
/// outputs and, for training, their gradients.
#[derive(Debug)]
pub struct Features<B: Ops> {
    pub batch: usize,
    pub x: B::Storage<f32>,
    pub(super) a1: B::Storage<f32>,
    pub(super) a2: B::Storage<f32>,
    /// `(da1, da2)`; `None` for evaluation.
    pub(super) grads: Option<(B::Storage<f32>, B::Storage<f32>)>,
}

/// The pooled (and dropped-out) activations, which the convolution stack
/// writes and the fully connected stack reads, and their gradient, which
/// travel between a pipeline's stages.
#[derive(Debug)]
pub struct Cut<B: Ops> {
    pub(crate) pooled: B::Storage<f32>,
    /// `None` for evaluation.
    pub(super) dpooled: Option<B::Storage<f32>>,
}

/// The fully connected stack's buffers: its hidden layer, the logits, the
/// labels the loss and the accuracy read and, for training, the gradients.
#[derive(Debug)]
pub struct Head<B: Ops> {
    pub batch: usize,
    pub labels: B::Storage<u8>,
    pub(super) hidden: B::Storage<f32>,
    pub logits: B::Storage<f32>,
    pub grads: Option<HeadGrads<B>>,
}

/// The fully connected stack's activation gradients.
#[derive(Debug)]
pub struct HeadGrads<B: Ops> {
    /// Written by the loss, read by backward.
    pub dlogits: B::Storage<f32>,
    pub(super) dhidden: B::Storage<f32>,
}

/// An activation buffer on `B`'s device.
type Values<B> = <B as Backend>::Storage<f32>;

/// A cut's gradient to read and its pooled activations to write, at once
/// (see [`Cut::dpooled_and_pooled`]).
pub(crate) type GradAndPooled<'a, B> = (&'a Values<B>, &'a mut Values<B>);

/// `values` zeros, and as many more for the gradient when `with_grads`.
fn with_grad<B: Ops>(
    b: &B,
    values: usize,
    with_grads: bool,
) -> Result<(Values<B>, Option<Values<B>>)> {
    let grad = with_grads.then(|| b.zeros(values)).transpose()?;
    Ok((b.zeros(values)?, grad))
}

impl<B: Ops> Activations<B> {
    /// Buffers for `batch` images; `with_grads` false allocates only what
    /// evaluation needs.
    pub fn new(b: &B, batch: usize, with_grads: bool) -> Result<Self> {
        Ok(Self {
            features: Features::new(b, batch, with_grads)?,
            cut: Cut::new(b, batch, with_grads)?,
            head: Head::new(b, batch, with_grads)?,
        })
    }
}

impl<B: Ops> Features<B> {
    pub(crate) fn new(b: &B, batch: usize, with_grads: bool) -> Result<Self> {
        Self::around(b, batch, Self::images(b, batch)?, with_grads)
    }

    /// The buffers for `batch` images but the images, which are `x` (a
    /// pipeline's slot lends it each micro-batch's own in turn).
    pub(crate) fn around(
        b: &B,
        batch: usize,
        x: B::Storage<f32>,
        with_grads: bool,
    ) -> Result<Self> {
        let (a1, da1) = with_grad(b, batch * CONV1.out_image_len(), with_grads)?;
        let (a2, da2) = with_grad(b, batch * CONV2.out_image_len(), with_grads)?;
        Ok(Self {
            batch,
            x,
            a1,
            a2,
            grads: da1.zip(da2),
        })
    }

    /// A buffer for `batch` images, the length of [`Features::x`].
    pub(crate) fn images(b: &B, batch: usize) -> Result<B::Storage<f32>> {
        b.zeros(batch * CONV1.in_image_len())
    }
}

/// The gradients of the convolution stack's activations (`da1`, `da2`)
/// and of the cut (`dpooled`) for `batch` images, apart from the
/// activations: a pipeline's stage 0 keeps one set per micro-batch size
/// and lends it to the one micro-batch whose backward runs.
pub(crate) struct FeatureGrads<B: Ops> {
    grads: Option<(Values<B>, Values<B>)>,
    dpooled: Option<Values<B>>,
}

impl<B: Ops> FeatureGrads<B> {
    pub(crate) fn new(b: &B, batch: usize) -> Result<Self> {
        let (da1, da2) = (CONV1.out_image_len(), CONV2.out_image_len());
        Ok(Self {
            grads: Some((b.zeros(batch * da1)?, b.zeros(batch * da2)?)),
            dpooled: Some(b.zeros(batch * FC1.in_features)?),
        })
    }

    /// Swaps these gradients with those of `f` and `cut` (buffers of the
    /// same batch built without them): lends them, or takes them back.
    /// Moves handles and copies nothing.
    pub(crate) fn trade(&mut self, f: &mut Features<B>, cut: &mut Cut<B>) {
        std::mem::swap(&mut self.grads, &mut f.grads);
        std::mem::swap(&mut self.dpooled, &mut cut.dpooled);
    }
}

impl<B: Ops> Cut<B> {
    pub(crate) fn new(b: &B, batch: usize, with_grads: bool) -> Result<Self> {
        let (pooled, dpooled) = with_grad(b, batch * FC1.in_features, with_grads)?;
        Ok(Self { pooled, dpooled })
    }

    /// The gradient of the pooled activations; an error for evaluation
    /// buffers.
    pub(crate) fn dpooled(&self) -> anyhow::Result<&B::Storage<f32>> {
        self.dpooled.as_ref().context(TRAINING_ONLY)
    }

    /// [`Self::dpooled`], to write.
    pub(crate) fn dpooled_mut(&mut self) -> anyhow::Result<&mut B::Storage<f32>> {
        for_training(&mut self.dpooled)
    }

    /// [`Self::dpooled`] to read and the pooled activations to write, at
    /// once: a pipeline's last stage sends one micro-batch's gradient
    /// while it receives the next one's activations into the same cut.
    pub(crate) fn dpooled_and_pooled(&mut self) -> anyhow::Result<GradAndPooled<'_, B>> {
        let dpooled = self.dpooled.as_ref().context(TRAINING_ONLY)?;
        Ok((dpooled, &mut self.pooled))
    }
}

impl<B: Ops> Head<B> {
    pub(crate) fn new(b: &B, batch: usize, with_grads: bool) -> Result<Self> {
        let (labels, logits) = (Self::labels(b, batch)?, Self::logits(b, batch)?);
        Self::around(b, batch, labels, logits, with_grads)
    }

    /// The buffers for `batch` samples but the labels and the logits, which
    /// are those given (see [`Features::around`]).
    pub(crate) fn around(
        b: &B,
        batch: usize,
        labels: B::Storage<u8>,
        logits: B::Storage<f32>,
        with_grads: bool,
    ) -> Result<Self> {
        let (hidden, dhidden) = with_grad(b, batch * FC1.out_features, with_grads)?;
        let dlogits = with_grads.then(|| Self::logits(b, batch)).transpose()?;
        Ok(Self {
            batch,
            labels,
            hidden,
            logits,
            grads: dlogits
                .zip(dhidden)
                .map(|(dlogits, dhidden)| HeadGrads { dlogits, dhidden }),
        })
    }

    /// A buffer for `batch` labels, the length of [`Head::labels`].
    pub(crate) fn labels(b: &B, batch: usize) -> Result<B::Storage<u8>> {
        b.zeros(batch)
    }

    /// A buffer for `batch` samples' logits, the length of [`Head::logits`].
    pub(crate) fn logits(b: &B, batch: usize) -> Result<B::Storage<f32>> {
        b.zeros(batch * FC2.out_features)
    }

    /// The cross-entropy of the logits: its sum added to `loss_sum`, its
    /// gradient written to `dlogits`.
    pub(crate) fn loss(&mut self, b: &B, loss_sum: &mut B::Storage<f32>) -> anyhow::Result<()> {
        let g = for_training(&mut self.grads)?;
        let geom = classes(self.batch);
        Ok(b.cross_entropy_fwd_bwd(&geom, &self.logits, &self.labels, &mut g.dlogits, loss_sum)?)
    }

    /// Adds the number of correct predictions to `correct`.
    pub(crate) fn count_correct(&self, b: &B, correct: &mut B::Storage<f32>) -> Result<()> {
        b.count_correct(&classes(self.batch), &self.logits, &self.labels, correct)
    }
}
