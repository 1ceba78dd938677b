//! The CNN's activation buffers, sized from the layer geometry in `cnn.rs`.

use anyhow::Context;
use core_tensor::{Ops, Result};

use super::{CONV1, CONV2, FC1, FC2};

/// What a use of the gradients of evaluation buffers is told.
const TRAINING_ONLY: &str = "backward needs buffers built for training";

/// Every buffer one forward/backward pass over `batch` images needs,
/// allocated once and reused step after step.
#[derive(Debug)]
pub struct Activations<B: Ops> {
    pub batch: usize,
    pub x: B::Storage<f32>,
    pub labels: B::Storage<u8>,
    pub(super) a1: B::Storage<f32>,
    pub(super) a2: B::Storage<f32>,
    /// Where a two-stage pipeline cuts the network (see `pipeline`).
    pub(crate) pooled: B::Storage<f32>,
    pub(super) hidden: B::Storage<f32>,
    pub logits: B::Storage<f32>,
    /// What backward needs; `None` for evaluation, which allocates none of
    /// it (a GPU cannot allocate an empty buffer anyway).
    pub grads: Option<ActivationGrads<B>>,
}

/// The gradient of every activation, for backward.
#[derive(Debug)]
pub struct ActivationGrads<B: Ops> {
    /// Written by the loss, read by backward.
    pub dlogits: B::Storage<f32>,
    pub(super) dhidden: B::Storage<f32>,
    pub(crate) dpooled: B::Storage<f32>,
    pub(super) da2: B::Storage<f32>,
    pub(super) da1: B::Storage<f32>,
}

impl<B: Ops> ActivationGrads<B> {
    /// The gradients in `grads` (an `Activations`' field, borrowed alone so
    /// the other buffers stay free); an error for evaluation buffers.
    pub(crate) fn of(grads: &mut Option<Self>) -> anyhow::Result<&mut Self> {
        grads.as_mut().context(TRAINING_ONLY)
    }

    /// [`Self::of`], to read.
    pub(crate) fn of_ref(grads: &Option<Self>) -> anyhow::Result<&Self> {
        grads.as_ref().context(TRAINING_ONLY)
    }
}

impl<B: Ops> AsMut<Activations<B>> for Activations<B> {
    fn as_mut(&mut self) -> &mut Activations<B> {
        self
    }
}

impl<B: Ops> Activations<B> {
    /// Buffers for `batch` images; `with_grads` false allocates only what
    /// evaluation needs.
    pub fn new(b: &B, batch: usize, with_grads: bool) -> Result<Self> {
        let a1 = batch * CONV1.out_image_len();
        let a2 = batch * CONV2.out_image_len();
        let pooled = batch * FC1.in_features;
        let hidden = batch * FC1.out_features;
        let logits = batch * FC2.out_features;
        let grads = with_grads
            .then(|| -> Result<_> {
                Ok(ActivationGrads {
                    dlogits: b.zeros(logits)?,
                    dhidden: b.zeros(hidden)?,
                    dpooled: b.zeros(pooled)?,
                    da2: b.zeros(a2)?,
                    da1: b.zeros(a1)?,
                })
            })
            .transpose()?;
        Ok(Self {
            batch,
            x: b.zeros(batch * CONV1.in_image_len())?,
            labels: b.zeros(batch)?,
            a1: b.zeros(a1)?,
            a2: b.zeros(a2)?,
            pooled: b.zeros(pooled)?,
            hidden: b.zeros(hidden)?,
            logits: b.zeros(logits)?,
            grads,
        })
    }
}
