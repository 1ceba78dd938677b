//! A pipeline stage's buffers: the activations of its own layers and of
//! the cut between the stages, nothing of the other stage's layers, and
//! only for the micro-batches the schedule has in flight.
//!
//! The activations live in slots that the micro-batches take in turn. On
//! stage 0 micro-batch `i`'s forward runs while `i - 1` waits for its
//! gradient, so two slots serve it: `i` takes slot `i mod 2`. Only one of
//! them runs a backward at a time, so stage 0's slots hold no gradients:
//! one set per micro-batch size ([`SharedGrads`]) is lent to the
//! micro-batch whose gradient arrives, for its backward. The last
//! stage runs each micro-batch from forward to backward at once: in its
//! exchange it sends `i - 1`'s gradient from one buffer of the cut while it
//! receives `i`'s pooled activations into the other, so one slot serves
//! it. Every op checks its buffers' lengths against the batch, so a slot
//! serves micro-batches of one size: a batch the micro-batches do not
//! divide splits into two sizes (see `PipelineStage::buffers`), each with
//! its own slots (on stage 0 at most 4 then, on the last stage 2).
//!
//! What outlives its micro-batch's turn in a slot is kept per micro-batch
//! ([`Micro`]): the inputs the data set gathers before the schedule starts
//! (stage 0's images, the last stage's labels) and the last stage's logits,
//! which the trainer's loss and accuracy read after it ends (3.1 kB and
//! 41 bytes a sample). While a micro-batch runs they are in its slot:
//! [`Slotted::start`] swaps them in and [`Slotted::finish`] back out,
//! which moves handles and copies nothing, so a GPU neither copies nor
//! waits. Between micro-batches a slot holds placeholders in their place,
//! which nothing reads (one value each: a GPU cannot allocate none).

use anyhow::Context;
use core_tensor::{Elem, Ops, Result};

use super::stage_params;
use crate::models::cnn::{
    BatchInputs, Cut, FeatureGrads, Features, GradAndPooled, Head, InputPart, classes,
};

/// A stage's buffers: its layers' activations in slots, for the
/// micro-batches or for the whole batch when evaluating, with their
/// gradients for training (in the slot on the last stage, lent to one slot
/// at a time on stage 0), and the training scratch of its parameter
/// gradients. Each
/// stage's activations are of its own layers and the cut between the
/// stages only: stage 0's code is handed [`FrontActs`], the last stage's
/// [`BackActs`], so neither can reach a buffer the other stage's layers
/// need.
pub struct PipeBuffers<B: Ops> {
    pub(super) acts: StageActs<B>,
    /// `None` for evaluation.
    pub(super) train: Option<GradScratch<B>>,
}

/// One stage's activations, and what each micro-batch keeps of its own.
pub(super) enum StageActs<B: Ops> {
    Front(Slotted<FrontActs<B>, Images<B>>, SharedGrads<B>),
    Back(Slotted<BackActs<B>, Scores<B>>),
}

/// Stage 0's activation gradients: one set per micro-batch size (none
/// for evaluation), lent to the micro-batch whose backward runs.
pub(super) struct SharedGrads<B: Ops>(Vec<(usize, FeatureGrads<B>)>);

impl<B: Ops> SharedGrads<B> {
    /// Runs `f` on the slot `act` of a micro-batch of `samples` with the
    /// gradients of that size lent to it, and takes them back, also when
    /// `f` fails.
    pub(super) fn lend<R>(
        &mut self,
        samples: usize,
        act: &mut FrontActs<B>,
        f: impl FnOnce(&mut FrontActs<B>) -> anyhow::Result<R>,
    ) -> anyhow::Result<R> {
        let (_, grads) = (self.0.iter_mut())
            .find(|(n, _)| *n == samples)
            .context(TRAINING_BUFFERS)?;
        grads.trade(&mut act.features, &mut act.cut);
        let result = f(act);
        grads.trade(&mut act.features, &mut act.cut);
        result
    }
}

/// Stage 0's: the convolution stack's buffers and the cut it sends
/// forward.
pub(super) struct FrontActs<B: Ops> {
    pub(super) features: Features<B>,
    pub(super) cut: Cut<B>,
}

/// The last stage's: the cut it receives and the fully connected stack's
/// buffers.
pub(super) struct BackActs<B: Ops> {
    pub(super) cut: Cut<B>,
    pub(super) head: Head<B>,
}

/// Slots of activations `A` and the micro-batches (in the batch's order)
/// that take them, each with its own buffers `O`.
pub(super) struct Slotted<A, O> {
    slots: Vec<A>,
    pub(super) micro: Vec<Micro<O>>,
}

/// One micro-batch: its size, its slot and its own buffers.
pub(super) struct Micro<O> {
    pub(super) samples: usize,
    slot: usize,
    own: O,
}

/// Stage 0's own buffer of a micro-batch: its images.
pub(super) struct Images<B: Ops>(B::Storage<f32>);

/// The last stage's own buffers of a micro-batch: its labels and logits.
pub(super) struct Scores<B: Ops> {
    labels: B::Storage<u8>,
    logits: B::Storage<f32>,
}

/// A micro-batch's own buffers, which trade places with their slot's.
pub(super) trait Own<A> {
    fn trade(&mut self, slot: &mut A);
}

impl<B: Ops> Own<FrontActs<B>> for Images<B> {
    fn trade(&mut self, slot: &mut FrontActs<B>) {
        std::mem::swap(&mut self.0, &mut slot.features.x);
    }
}

impl<B: Ops> Own<BackActs<B>> for Scores<B> {
    fn trade(&mut self, slot: &mut BackActs<B>) {
        std::mem::swap(&mut self.labels, &mut slot.head.labels);
        std::mem::swap(&mut self.logits, &mut slot.head.logits);
    }
}

impl<A, O: Own<A>> Slotted<A, O> {
    /// Micro-batch `i`'s slot, with the micro-batch's own buffers in it.
    pub(super) fn start(&mut self, i: usize) -> &mut A {
        self.trade(i);
        self.slot(i)
    }

    /// Micro-batch `i` is done with its slot: its own buffers come back.
    pub(super) fn finish(&mut self, i: usize) {
        self.trade(i);
    }

    fn trade(&mut self, i: usize) {
        let Micro { slot, own, .. } = &mut self.micro[i];
        own.trade(&mut self.slots[*slot]);
    }
}

impl<A, O> Slotted<A, O> {
    /// Micro-batch `i`'s slot.
    pub(super) fn slot(&mut self, i: usize) -> &mut A {
        &mut self.slots[self.micro[i].slot]
    }

    /// Whether micro-batches `i` and `j` take the same slot.
    fn share_slot(&self, i: usize, j: usize) -> bool {
        self.micro[i].slot == self.micro[j].slot
    }

    /// The slots of micro-batches `i` and `j`, which take different ones.
    pub(super) fn two(&mut self, i: usize, j: usize) -> anyhow::Result<(&mut A, &mut A)> {
        let (si, sj) = (self.micro[i].slot, self.micro[j].slot);
        if si < sj {
            let (low, high) = self.slots.split_at_mut(sj);
            Ok((&mut low[si], &mut high[0]))
        } else if sj < si {
            let (low, high) = self.slots.split_at_mut(si);
            Ok((&mut high[0], &mut low[sj]))
        } else {
            anyhow::bail!("micro-batches {i} and {j} are in flight together but share a slot")
        }
    }

    /// Micro-batches of `sizes` samples, in slots made by `make` for the
    /// sizes: micro-batch `i` of `n` samples takes the slot of `key(i, n)`
    /// (its size first), and `own(n)` makes its own buffers.
    fn new(
        sizes: &[usize],
        key: impl Fn(usize, usize) -> (usize, usize),
        make: impl Fn(usize) -> Result<A>,
        own: impl Fn(usize) -> Result<O>,
    ) -> Result<Self> {
        let mut keys = Vec::new();
        let mut micro = Vec::with_capacity(sizes.len());
        for (i, &samples) in sizes.iter().enumerate() {
            let k = key(i, samples);
            let slot = keys.iter().position(|&at| at == k).unwrap_or(keys.len());
            if slot == keys.len() {
                keys.push(k);
            }
            let own = own(samples)?;
            micro.push(Micro { samples, slot, own });
        }
        let slots = keys.iter().map(|&(n, _)| make(n)).collect::<Result<_>>()?;
        Ok(Self { slots, micro })
    }
}

impl<B: Ops> Slotted<BackActs<B>, Scores<B>> {
    /// The last stage's exchange before micro-batch `i`: the gradient of
    /// `i - 1`'s pooled activations to send back, and the buffer for
    /// `i`'s to arrive in.
    pub(super) fn handover(&mut self, i: usize) -> anyhow::Result<GradAndPooled<'_, B>> {
        if self.share_slot(i - 1, i) {
            return self.slot(i).cut.dpooled_and_pooled();
        }
        let (sent, next) = self.two(i - 1, i)?;
        Ok((sent.cut.dpooled()?, &mut next.cut.pooled))
    }
}

impl<B: Ops> Micro<Scores<B>> {
    /// Adds the number of the micro-batch's correct predictions to
    /// `correct`.
    pub(super) fn count_correct(&self, b: &B, correct: &mut B::Storage<f32>) -> Result<()> {
        let Scores { labels, logits } = &self.own;
        b.count_correct(&classes(self.samples), logits, labels, correct)
    }
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

/// The data set fills each micro-batch's own buffers with what its stage
/// reads: the images on stage 0, the labels on the last stage.
impl<B: Ops> BatchInputs<B> for PipeBuffers<B> {
    fn parts(&mut self) -> Vec<InputPart<'_, B>> {
        match &mut self.acts {
            StageActs::Front(acts, _) => acts
                .micro
                .iter_mut()
                .map(|m| InputPart {
                    samples: m.samples,
                    images: Some(&mut m.own.0),
                    labels: None,
                })
                .collect(),
            StageActs::Back(acts) => acts
                .micro
                .iter_mut()
                .map(|m| InputPart {
                    samples: m.samples,
                    images: None,
                    labels: Some(&mut m.own.labels),
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
            let front = |n| -> Result<_> {
                Ok(FrontActs {
                    features: Features::around(b, n, placeholder(b)?, false)?,
                    cut: Cut::new(b, n, false)?,
                })
            };
            let images = |n| Ok(Images(Features::images(b, n)?));
            let mut grads: Vec<(usize, FeatureGrads<B>)> = Vec::new();
            if train {
                for &n in sizes {
                    if grads.iter().all(|&(held, _)| held != n) {
                        grads.push((n, FeatureGrads::new(b, n)?));
                    }
                }
            }
            let slots = Slotted::new(sizes, |i, n| (n, i % 2), front, images)?;
            StageActs::Front(slots, SharedGrads(grads))
        } else {
            let back = |n| -> Result<_> {
                Ok(BackActs {
                    cut: Cut::new(b, n, train)?,
                    head: Head::around(b, n, placeholder(b)?, placeholder(b)?, train)?,
                })
            };
            let scores = |n| -> Result<_> {
                Ok(Scores {
                    labels: Head::labels(b, n)?,
                    logits: Head::logits(b, n)?,
                })
            };
            StageActs::Back(Slotted::new(sizes, |_, n| (n, 0), back, scores)?)
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

/// What a slot holds in place of a micro-batch's own buffer between
/// micro-batches (see the module docs).
fn placeholder<B: Ops, T: Elem>(b: &B) -> Result<B::Storage<T>> {
    b.zeros(1)
}

#[cfg(test)]
#[path = "buffers_tests.rs"]
mod tests;
