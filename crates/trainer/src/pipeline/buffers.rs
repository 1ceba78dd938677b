//! A pipeline stage's buffers: the activations of its own layers and of
//! the cut between the stages, and nothing of the other stage's layers.

use anyhow::Context;
use core_tensor::{Ops, Result};

use super::stage_params;
use crate::model::cnn::{BatchInputs, Cut, Features, Head, InputPart};

/// A stage's buffers: its layers' activations (with their gradients, for
/// training) for each micro-batch, or for the whole batch when evaluating,
/// and the training scratch of its parameter gradients. Each stage's
/// activations are of its own layers and the cut between the stages only:
/// stage 0's code is handed [`FrontActs`], the last stage's [`BackActs`],
/// so neither can reach a buffer the other stage's layers need.
pub struct PipeBuffers<B: Ops> {
    pub(super) acts: StageActs<B>,
    /// `None` for evaluation.
    pub(super) train: Option<GradScratch<B>>,
}

/// One stage's activations, one set per micro-batch (or one for the
/// whole batch).
pub(super) enum StageActs<B: Ops> {
    Front(Vec<FrontActs<B>>),
    Back(Vec<BackActs<B>>),
}

/// Stage 0's: the convolution stack's buffers (the images its own) and
/// the cut it sends forward.
pub(super) struct FrontActs<B: Ops> {
    pub(super) features: Features<B>,
    pub(super) cut: Cut<B>,
}

/// The last stage's: the cut it receives and the fully connected stack's
/// buffers (the labels its own).
pub(super) struct BackActs<B: Ops> {
    pub(super) cut: Cut<B>,
    pub(super) head: Head<B>,
}

/// What training adds to a stage's activations.
pub(super) struct GradScratch<B: Ops> {
    /// One micro-batch's gradients of the stage's parameters.
    pub(super) grads: B::Storage<f32>,
    /// The stage's gradients summed over the micro-batches, on the host.
    pub(super) acc: Vec<f32>,
    /// One micro-batch's stage gradients, read from the device.
    pub(super) host: Vec<f32>,
    /// The last stage's loss sum, which the schedule writes and nobody
    /// reads (`None` on stage 0, which computes no loss).
    pub(super) loss: Option<B::Storage<f32>>,
}

/// What a stage asks of buffers it needs for training.
pub(super) const TRAINING_BUFFERS: &str = "a pipeline schedule needs buffers built for training";

impl<B: Ops> PipeBuffers<B> {
    /// The training scratch; an error for evaluation buffers.
    pub(super) fn scratch(&mut self) -> anyhow::Result<&mut GradScratch<B>> {
        self.train.as_mut().context(TRAINING_BUFFERS)
    }
}

/// The data set fills each micro-batch with what its stage reads: the
/// images on stage 0, the labels on the last stage.
impl<B: Ops> BatchInputs<B> for PipeBuffers<B> {
    fn parts(&mut self) -> Vec<InputPart<'_, B>> {
        match &mut self.acts {
            StageActs::Front(parts) => parts
                .iter_mut()
                .map(|a| InputPart {
                    samples: a.features.batch,
                    images: Some(&mut a.features.x),
                    labels: None,
                })
                .collect(),
            StageActs::Back(parts) => parts
                .iter_mut()
                .map(|a| InputPart {
                    samples: a.head.batch,
                    images: None,
                    labels: Some(&mut a.head.labels),
                })
                .collect(),
        }
    }
}

impl<B: Ops> PipeBuffers<B> {
    /// Stage `stage`'s buffers for micro-batches of `sizes` samples (one
    /// for evaluation), with gradients and their scratch when `train`.
    pub(super) fn new(b: &B, stage: usize, sizes: &[usize], train: bool) -> Result<Self> {
        let first = stage == 0;
        let acts = if first {
            let front = |&n: &usize| -> Result<_> {
                Ok(FrontActs {
                    features: Features::new(b, n, train)?,
                    cut: Cut::new(b, n, train)?,
                })
            };
            StageActs::Front(sizes.iter().map(front).collect::<Result<_>>()?)
        } else {
            let back = |&n: &usize| -> Result<_> {
                Ok(BackActs {
                    cut: Cut::new(b, n, train)?,
                    head: Head::new(b, n, train)?,
                })
            };
            StageActs::Back(sizes.iter().map(back).collect::<Result<_>>()?)
        };
        let part = stage_params(stage).len();
        let train = train
            .then(|| -> Result<_> {
                Ok(GradScratch {
                    grads: b.zeros(part)?,
                    acc: vec![0.0; part],
                    host: vec![0.0; part],
                    loss: (!first).then(|| b.zeros(1)).transpose()?,
                })
            })
            .transpose()?;
        Ok(Self { acts, train })
    }
}
