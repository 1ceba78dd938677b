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
//! stage's replicas.
//!
//! Evaluation ([`evaluate`]) sends a whole test batch through at once:
//! stage 0's features forward, the last stage's head.

use anyhow::Context;
use core_tensor::{Ops, rng};

use super::{PipeBuffers, PipelineStage, StageLink, classes};
use crate::model::{ActivationGrads, Activations, Mode, NoSync};
use crate::train::timer::Phase;

/// One batch through this rank's stage.
pub(super) fn run<B: Ops>(
    stage: &PipelineStage<B>,
    b: &B,
    bufs: &mut PipeBuffers<B>,
    params: &B::Storage<f32>,
    seed: u64,
) -> anyhow::Result<()> {
    stage.mark(b, Some(Phase::Forward))?;
    let place = stage.place;
    let m = bufs.micro.len();
    let seeds: Vec<u64> = (0..m)
        .map(|i| rng::derive_seed(seed, &[i as u64]))
        .collect();
    split_inputs(b, bufs, place.stage == 0)?;
    bufs.acc.fill(0.0);
    let mut link = stage.link.borrow_mut();
    let mut link = Link {
        link: link.as_mut(),
        b,
        owner: stage,
        stage: place.stage,
    };
    let work = Work {
        stage,
        b,
        params,
        seeds: &seeds,
        scale: 1.0 / bufs.full.batch as f32,
    };
    if place.stage == 0 {
        work.forward_features(bufs, 0)?;
        link.exchange(Some(&bufs.micro[0].pooled), None)?;
        for i in 1..m {
            work.forward_features(bufs, i)?;
            let (done, now) = bufs.micro.split_at_mut(i);
            link.exchange(Some(&now[0].pooled), Some(dpooled(&mut done[i - 1])?))?;
            work.backward_features(bufs, i - 1)?;
        }
        link.exchange(None, Some(dpooled(&mut bufs.micro[m - 1])?))?;
        work.backward_features(bufs, m - 1)?;
    } else {
        link.exchange(None, Some(&mut bufs.micro[0].pooled))?;
        work.head(bufs, 0)?;
        for i in 1..m {
            let (done, now) = bufs.micro.split_at_mut(i);
            let back = &ActivationGrads::of_ref(&done[i - 1].grads)?.dpooled;
            link.exchange(Some(back), Some(&mut now[0].pooled))?;
            work.head(bufs, i)?;
        }
        let last = &ActivationGrads::of_ref(&bufs.micro[m - 1].grads)?.dpooled;
        link.exchange(Some(last), None)?;
    }
    stage.mark(b, None)?;
    Ok(())
}

/// One test batch (`full`, without dropout) through this rank's stage:
/// stage 0 sends its pooled activations, the last stage computes the
/// logits from them. Its waits are not marked: evaluation is not a step.
pub(super) fn evaluate<B: Ops>(
    stage: &PipelineStage<B>,
    b: &B,
    full: &mut Activations<B>,
    params: &B::Storage<f32>,
) -> anyhow::Result<()> {
    let (me, cnn) = (stage.place.stage, &stage.cnn);
    let mut link = stage.link.borrow_mut();
    let peer = 1 - me;
    let context = || format!("pipeline stage {me}: evaluating, exchanging with stage {peer}");
    if me == 0 {
        cnn.forward_features(b, full, params, Mode::Eval)?;
        link.exchange(b, peer, Some(&full.pooled), None)
            .with_context(context)
    } else {
        link.exchange(b, peer, None, Some(&mut full.pooled))
            .with_context(context)?;
        Ok(cnn.forward_head(b, full, params, Mode::Eval)?)
    }
}

fn dpooled<B: Ops>(act: &mut Activations<B>) -> anyhow::Result<&mut B::Storage<f32>> {
    Ok(&mut ActivationGrads::of(&mut act.grads)?.dpooled)
}

/// Copies each micro-batch's share of the batch the trainer gathered:
/// the images for the first stage, the labels for the last.
fn split_inputs<B: Ops>(b: &B, bufs: &mut PipeBuffers<B>, first: bool) -> anyhow::Result<()> {
    let pixels = B::len(&bufs.full.x) / bufs.full.batch.max(1);
    for (act, &start) in bufs.micro.iter_mut().zip(&bufs.starts) {
        let n = act.batch;
        if first {
            let mut host = vec![0.0_f32; n * pixels];
            b.read_range(
                &bufs.full.x,
                start * pixels..(start + n) * pixels,
                &mut host,
            )?;
            b.write_range(&host, &mut act.x, 0)?;
        } else {
            let mut host = vec![0_u8; n];
            b.read_range(&bufs.full.labels, start..start + n, &mut host)?;
            b.write_range(&host, &mut act.labels, 0)?;
        }
    }
    Ok(())
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
    seeds: &'a [u64],
    /// Stages over the batch's samples.
    scale: f32,
}

impl<B: Ops> Work<'_, B> {
    fn mode(&self, i: usize) -> Mode {
        Mode::Train {
            dropout_seed: self.seeds[i],
        }
    }

    /// Stage 0, forward of micro-batch `i`, to its pooled activations.
    fn forward_features(&self, bufs: &mut PipeBuffers<B>, i: usize) -> anyhow::Result<()> {
        self.stage.mark(self.b, Some(Phase::Forward))?;
        let act = &mut bufs.micro[i];
        let cnn = &self.stage.cnn;
        Ok(cnn.forward_features(self.b, act, self.params, self.mode(i))?)
    }

    /// Stage 0, backward of micro-batch `i` from the gradient of its pooled
    /// activations (received into its `dpooled`).
    fn backward_features(&self, bufs: &mut PipeBuffers<B>, i: usize) -> anyhow::Result<()> {
        self.stage.mark(self.b, Some(Phase::Backward))?;
        let (act, grads) = micro_and_grads(bufs, i)?;
        let cnn = &self.stage.cnn;
        cnn.backward_features(self.b, act, self.params, grads, self.seeds[i], &mut NoSync)?;
        self.accumulate(bufs, i)
    }

    /// Stage 1, forward, loss and backward of micro-batch `i` from its
    /// pooled activations (received), to their gradient (`dpooled`).
    fn head(&self, bufs: &mut PipeBuffers<B>, i: usize) -> anyhow::Result<()> {
        let (b, cnn) = (self.b, &self.stage.cnn);
        self.stage.mark(b, Some(Phase::Forward))?;
        let loss = bufs.loss.as_mut().context("training buffers")?;
        let act = &mut bufs.micro[i];
        cnn.forward_head(b, act, self.params, self.mode(i))?;
        let g = ActivationGrads::of(&mut act.grads)?;
        let geom = classes(act.batch);
        b.cross_entropy_fwd_bwd(&geom, &act.logits, &act.labels, &mut g.dlogits, loss)?;
        self.stage.mark(b, Some(Phase::Backward))?;
        let (act, grads) = micro_and_grads(bufs, i)?;
        cnn.backward_head(b, act, self.params, grads, self.seeds[i], &mut NoSync)?;
        self.accumulate(bufs, i)
    }

    /// Adds micro-batch `i`'s gradients of this stage's parameters into
    /// the accumulator, scaled to the batch mean.
    fn accumulate(&self, bufs: &mut PipeBuffers<B>, i: usize) -> anyhow::Result<()> {
        let grads = bufs.grads.as_ref().context("training buffers")?;
        self.b
            .read_range(grads, 0..bufs.host.len(), &mut bufs.host)?;
        let scale = self.scale * bufs.micro[i].batch as f32;
        for (a, g) in bufs.acc.iter_mut().zip(&bufs.host) {
            *a += g * scale;
        }
        Ok(())
    }
}

/// Micro-batch `i`'s buffers and the gradient scratch, borrowed together.
fn micro_and_grads<B: Ops>(
    bufs: &mut PipeBuffers<B>,
    i: usize,
) -> anyhow::Result<(&mut Activations<B>, &mut B::Storage<f32>)> {
    let grads = bufs.grads.as_mut().context("training buffers")?;
    Ok((&mut bufs.micro[i], grads))
}
