//! The 1F1B schedule of a two-stage pipeline over one batch of `M`
//! micro-batches. Stage 0 runs forward `0`, then for each next
//! micro-batch its forward and the previous one's backward; stage 1 runs
//! forward, loss and backward of each micro-batch as soon as its
//! activations arrive. Each step's messages go both ways in one
//! `send_recv` (activations of `i` forward, gradients of `i - 1` back), so
//! at most two micro-batches are in flight and neither stage waits on a
//! send:
//!
//! ```text
//! stage 0: F0 . F1 B0 F2 B1 ... F(M-1) B(M-2) . B(M-1)
//! stage 1: .  F0B0  F1B1  ...       F(M-1)B(M-1) .
//! ```
//!
//! Activations and their gradients travel from device buffer to device
//! buffer over the stage's [`StageLink`] (through the host, or NCCL
//! between GPUs). Each micro-batch's parameter gradients are added into
//! the stage's host accumulator scaled by `m / n` (`m` its samples, `n`
//! the batch's): the batch mean, which the trainer then averages over the
//! stage's replicas. The data set gathers each micro-batch's inputs into
//! its own buffers before the schedule starts: the images on stage 0, the
//! labels on the last stage. A micro-batch runs in a slot of activations
//! that the stage's micro-batches take in turn, from its start (its own
//! buffers move in) to its finish (they move out): two slots on stage 0,
//! one on the last stage, per micro-batch size (see `PipeBuffers`).
//!
//! Evaluation ([`evaluate`]) sends a whole test batch through at once:
//! stage 0's features forward, the last stage's head.

use anyhow::Context;
use core_tensor::{Ops, rng};

use super::buffers::{
    BackActs, FrontActs, GradScratch, Images, Scores, SharedGrads, Slotted, StageActs,
    TRAINING_BUFFERS,
};
use super::{PipeBuffers, PipelineStage, StageLink};
use crate::model::{Mode, NoSync};
use crate::models::cnn::Backward;
use crate::phases::Phase;

/// One batch through this rank's stage.
pub(super) fn run<B: Ops>(
    stage: &PipelineStage<B>,
    b: &B,
    bufs: &mut PipeBuffers<B>,
    params: &B::Storage<f32>,
    seed: u64,
) -> anyhow::Result<()> {
    stage.mark(b, Some(Phase::Forward))?;
    let mut link = stage.link.borrow_mut();
    let mut link = Link {
        link: link.as_mut(),
        b,
        owner: stage,
        stage: stage.place.stage,
    };
    let scratch = bufs.train.as_mut().context(TRAINING_BUFFERS)?;
    scratch.acc.fill(0.0);
    match &mut bufs.acts {
        StageActs::Front(acts, grads) => {
            let work = Work::new(stage, b, params, seed, acts.micro.iter().map(|m| m.samples));
            front(&work, &mut link, acts, grads, scratch)?;
        }
        StageActs::Back(acts) => {
            let work = Work::new(stage, b, params, seed, acts.micro.iter().map(|m| m.samples));
            back(&work, &mut link, acts, scratch)?;
        }
    }
    stage.mark(b, None)?;
    Ok(())
}

/// Stage 0's part of the schedule over its micro-batches: micro-batch
/// `i` starts in its slot before `i - 1` finishes in the other, which
/// borrows the gradients of its size to receive its gradient and run its
/// backward.
fn front<B: Ops>(
    work: &Work<'_, B>,
    link: &mut Link<'_, B>,
    acts: &mut Slotted<FrontActs<B>, Images<B>>,
    grads: &mut SharedGrads<B>,
    scratch: &mut GradScratch<B>,
) -> anyhow::Result<()> {
    let m = acts.micro.len();
    work.forward_features(acts.start(0), 0)?;
    link.exchange(Some(&acts.slot(0).cut.pooled), None)?;
    for i in 1..m {
        work.forward_features(acts.start(i), i)?;
        let samples = acts.micro[i - 1].samples;
        let (now, done) = acts.two(i, i - 1)?;
        grads.lend(samples, done, |done| {
            link.exchange(Some(&now.cut.pooled), Some(done.cut.dpooled_mut()?))?;
            work.backward_features(done, i - 1, scratch)
        })?;
        acts.finish(i - 1);
    }
    let samples = acts.micro[m - 1].samples;
    grads.lend(samples, acts.slot(m - 1), |last| {
        link.exchange(None, Some(last.cut.dpooled_mut()?))?;
        work.backward_features(last, m - 1, scratch)
    })?;
    acts.finish(m - 1);
    Ok(())
}

/// The last stage's part of the schedule over its micro-batches, each
/// from start to finish in its slot.
fn back<B: Ops>(
    work: &Work<'_, B>,
    link: &mut Link<'_, B>,
    acts: &mut Slotted<BackActs<B>, Scores<B>>,
    scratch: &mut GradScratch<B>,
) -> anyhow::Result<()> {
    let m = acts.micro.len();
    link.exchange(None, Some(&mut acts.slot(0).cut.pooled))?;
    work.head(acts.start(0), 0, scratch)?;
    acts.finish(0);
    for i in 1..m {
        let (back, next) = acts.handover(i)?;
        link.exchange(Some(back), Some(next))?;
        work.head(acts.start(i), i, scratch)?;
        acts.finish(i);
    }
    link.exchange(Some(acts.slot(m - 1).cut.dpooled()?), None)
}

/// One test batch (without dropout) through this rank's stage: stage 0
/// sends its pooled activations, the last stage computes the logits from
/// them. Its waits are not marked: evaluation is not a step.
pub(super) fn evaluate<B: Ops>(
    stage: &PipelineStage<B>,
    b: &B,
    bufs: &mut PipeBuffers<B>,
    params: &B::Storage<f32>,
) -> anyhow::Result<()> {
    let (me, cnn) = (stage.place.stage, &stage.cnn);
    let mut link = stage.link.borrow_mut();
    let peer = 1 - me;
    let context = || format!("pipeline stage {me}: evaluating, exchanging with stage {peer}");
    match &mut bufs.acts {
        StageActs::Front(acts, _) => (0..acts.micro.len()).try_for_each(|i| {
            let a = acts.start(i);
            cnn.forward_features(b, &mut a.features, &mut a.cut, params, Mode::Eval)?;
            link.exchange(b, peer, Some(&a.cut.pooled), None)
                .with_context(context)?;
            acts.finish(i);
            Ok(())
        }),
        StageActs::Back(acts) => (0..acts.micro.len()).try_for_each(|i| {
            let a = acts.start(i);
            link.exchange(b, peer, None, Some(&mut a.cut.pooled))
                .with_context(context)?;
            cnn.forward_head(b, &a.cut, &mut a.head, params, Mode::Eval)?;
            acts.finish(i);
            Ok(())
        }),
    }
}

/// This stage's end of the pipeline, marking its waits.
struct Link<'a, B: Ops> {
    link: &'a mut dyn StageLink<B>,
    b: &'a B,
    owner: &'a PipelineStage<B>,
    stage: usize,
}

impl<B: Ops> Link<'_, B> {
    fn exchange(
        &mut self,
        send: Option<&B::Storage<f32>>,
        recv: Option<&mut B::Storage<f32>>,
    ) -> anyhow::Result<()> {
        self.owner.mark(self.b, Some(Phase::PipelineWait))?;
        let peer = 1 - self.stage;
        self.link
            .exchange(self.b, peer, send, recv)
            .with_context(|| {
                format!(
                    "pipeline stage {}: exchanging with stage {peer}",
                    self.stage
                )
            })?;
        Ok(())
    }
}

/// What every micro-batch's passes share.
struct Work<'a, B: Ops> {
    stage: &'a PipelineStage<B>,
    b: &'a B,
    params: &'a B::Storage<f32>,
    seeds: Vec<u64>,
    /// Each micro-batch's share of the batch's samples: its gradients'
    /// weight in the batch mean.
    weights: Vec<f32>,
}

impl<'a, B: Ops> Work<'a, B> {
    /// The passes over micro-batches of `sizes` samples, in a step of
    /// dropout seed `seed`.
    fn new(
        stage: &'a PipelineStage<B>,
        b: &'a B,
        params: &'a B::Storage<f32>,
        seed: u64,
        sizes: impl Iterator<Item = usize> + Clone,
    ) -> Self {
        let batch: usize = sizes.clone().sum();
        let scale = 1.0 / batch as f32;
        Self {
            stage,
            b,
            params,
            seeds: (0..sizes.clone().count())
                .map(|i| rng::derive_seed(seed, &[i as u64]))
                .collect(),
            weights: sizes.map(|n| scale * n as f32).collect(),
        }
    }

    fn mode(&self, i: usize) -> Mode {
        Mode::Train {
            dropout_seed: self.seeds[i],
        }
    }

    fn backward(&self, i: usize) -> Backward<'a, B> {
        Backward {
            params: self.params,
            dropout_seed: self.seeds[i],
        }
    }

    /// Stage 0, forward of micro-batch `i`, to its pooled activations.
    fn forward_features(&self, act: &mut FrontActs<B>, i: usize) -> anyhow::Result<()> {
        self.stage.mark(self.b, Some(Phase::Forward))?;
        let cnn = &self.stage.cnn;
        Ok(cnn.forward_features(
            self.b,
            &mut act.features,
            &mut act.cut,
            self.params,
            self.mode(i),
        )?)
    }

    /// Stage 0, backward of micro-batch `i` from the gradient of its pooled
    /// activations (received into its cut).
    fn backward_features(
        &self,
        act: &mut FrontActs<B>,
        i: usize,
        scratch: &mut GradScratch<B>,
    ) -> anyhow::Result<()> {
        self.stage.mark(self.b, Some(Phase::Backward))?;
        let cnn = &self.stage.cnn;
        let (f, cut, step) = (&mut act.features, &mut act.cut, self.backward(i));
        cnn.backward_features(self.b, f, cut, step, &mut scratch.grads, &mut NoSync)?;
        self.accumulate(scratch, i)
    }

    /// The last stage, forward, loss and backward of micro-batch `i` from
    /// its pooled activations (received), to their gradient.
    fn head(
        &self,
        act: &mut BackActs<B>,
        i: usize,
        scratch: &mut GradScratch<B>,
    ) -> anyhow::Result<()> {
        let (b, cnn) = (self.b, &self.stage.cnn);
        self.stage.mark(b, Some(Phase::Forward))?;
        let loss = scratch
            .loss
            .as_mut()
            .context("the last stage's loss buffer")?;
        cnn.forward_head(b, &act.cut, &mut act.head, self.params, self.mode(i))?;
        act.head.loss(b, loss)?;
        self.stage.mark(b, Some(Phase::Backward))?;
        let (cut, h, step) = (&mut act.cut, &mut act.head, self.backward(i));
        cnn.backward_head(b, cut, h, step, &mut scratch.grads, &mut NoSync)?;
        self.accumulate(scratch, i)
    }

    /// Adds micro-batch `i`'s gradients of this stage's parameters into
    /// the accumulator, scaled to the batch mean.
    fn accumulate(&self, scratch: &mut GradScratch<B>, i: usize) -> anyhow::Result<()> {
        let GradScratch {
            grads, acc, host, ..
        } = scratch;
        self.b.read_range(grads, 0..host.len(), host)?;
        let weight = self.weights[i];
        for (a, g) in acc.iter_mut().zip(host.iter()) {
            *a += g * weight;
        }
        Ok(())
    }
}
