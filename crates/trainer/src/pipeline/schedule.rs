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
//! Activations and their gradients cross through host memory (the
//! communicator's host slices). Each micro-batch's parameter gradients
//! are added into the stage's host accumulator scaled by `S x m / n`
//! (`m` its samples, `n` the batch's): the batch mean, times the number of
//! stages that the trainer's average over all ranks divides back out.

use std::time::{Duration, Instant};

use anyhow::Context;
use comm::Communicator;
use core_tensor::{Ops, rng};

use super::{PipeBuffers, PipelineStage, classes, stage_params};
use crate::model::{Activations, Mode, NoSync};

/// One batch through this rank's stage.
pub(super) fn run<B: Ops>(
    stage: &PipelineStage,
    b: &B,
    bufs: &mut PipeBuffers<B>,
    params: &B::Storage<f32>,
    seed: u64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let place = stage.place;
    let m = bufs.micro.len();
    let seeds: Vec<u64> = (0..m)
        .map(|i| rng::derive_seed(seed, &[i as u64]))
        .collect();
    split_inputs(b, bufs, place.stage == 0)?;
    bufs.acc.fill(0.0);
    let mut comm = stage.comm.borrow_mut();
    let mut link = Link {
        comm: comm.as_mut(),
        peer: 1 - place.stage,
        waiting: Duration::ZERO,
    };
    let mut out = Vec::new();
    let mut inc = Vec::new();
    let work = Work {
        stage,
        b,
        params,
        seeds: &seeds,
        scale: place.stages as f32 / bufs.full.batch as f32,
    };
    if place.stage == 0 {
        work.forward_features(bufs, 0, &mut out)?;
        link.exchange(Some(&out), None)?;
        for i in 1..m {
            work.forward_features(bufs, i, &mut out)?;
            inc.resize(B::len(&bufs.micro[i - 1].pooled), 0.0);
            link.exchange(Some(&out), Some(&mut inc))?;
            work.backward_features(bufs, i - 1, &inc)?;
        }
        inc.resize(B::len(&bufs.micro[m - 1].pooled), 0.0);
        link.exchange(None, Some(&mut inc))?;
        work.backward_features(bufs, m - 1, &inc)?;
    } else {
        inc.resize(B::len(&bufs.micro[0].pooled), 0.0);
        link.exchange(None, Some(&mut inc))?;
        work.head(bufs, 0, &inc, &mut out)?;
        for i in 1..m {
            inc.resize(B::len(&bufs.micro[i].pooled), 0.0);
            link.exchange(Some(&out), Some(&mut inc))?;
            work.head(bufs, i, &inc, &mut out)?;
        }
        link.exchange(Some(&out), None)?;
    }
    let mut times = stage.times.borrow_mut();
    times.total += started.elapsed();
    times.waiting += link.waiting;
    Ok(())
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

/// This stage's end of the pipeline's communicator, timing its waits.
struct Link<'a> {
    comm: &'a mut dyn Communicator,
    peer: usize,
    waiting: Duration,
}

impl Link<'_> {
    fn exchange(&mut self, send: Option<&[f32]>, recv: Option<&mut [f32]>) -> anyhow::Result<()> {
        let started = Instant::now();
        let peer = self.peer;
        self.comm
            .send_recv(send.map(|s| (s, peer)), recv.map(|r| (r, peer)))
            .with_context(|| {
                format!("pipeline stage {}: exchanging with stage {peer}", 1 - peer)
            })?;
        self.waiting += started.elapsed();
        Ok(())
    }
}

/// What every micro-batch's passes share.
struct Work<'a, B: Ops> {
    stage: &'a PipelineStage,
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

    /// Stage 0, forward of micro-batch `i`: its pooled activations to `out`.
    fn forward_features(
        &self,
        bufs: &mut PipeBuffers<B>,
        i: usize,
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let act = &mut bufs.micro[i];
        self.stage
            .cnn
            .forward_features(self.b, act, self.params, self.mode(i))?;
        read_all(self.b, &act.pooled, out)
    }

    /// Stage 0, backward of micro-batch `i` from the gradient `dpooled`.
    fn backward_features(
        &self,
        bufs: &mut PipeBuffers<B>,
        i: usize,
        dpooled: &[f32],
    ) -> anyhow::Result<()> {
        let (act, grads) = micro_and_grads(bufs, i)?;
        let g = act.grads.as_mut().context("training buffers")?;
        self.b.write_range(dpooled, &mut g.dpooled, 0)?;
        self.stage.cnn.backward_features(
            self.b,
            act,
            self.params,
            grads,
            self.seeds[i],
            &mut NoSync,
        )?;
        self.accumulate(bufs, i)
    }

    /// Stage 1, forward, loss and backward of micro-batch `i` from its
    /// pooled activations; the gradient of those to `out`.
    fn head(
        &self,
        bufs: &mut PipeBuffers<B>,
        i: usize,
        pooled: &[f32],
        out: &mut Vec<f32>,
    ) -> anyhow::Result<()> {
        let b = self.b;
        let loss = bufs.loss.as_mut().context("training buffers")?;
        let act = &mut bufs.micro[i];
        b.write_range(pooled, &mut act.pooled, 0)?;
        self.stage
            .cnn
            .forward_head(b, act, self.params, self.mode(i))?;
        let g = act.grads.as_mut().context("training buffers")?;
        b.cross_entropy_fwd_bwd(
            &classes(act.batch),
            &act.logits,
            &act.labels,
            &mut g.dlogits,
            loss,
        )?;
        let (act, grads) = micro_and_grads(bufs, i)?;
        self.stage
            .cnn
            .backward_head(b, act, self.params, grads, self.seeds[i], &mut NoSync)?;
        let g = act.grads.as_ref().context("training buffers")?;
        read_all(b, &g.dpooled, out)?;
        self.accumulate(bufs, i)
    }

    /// Adds micro-batch `i`'s gradients of this stage's parameters into
    /// the accumulator, scaled to the batch mean (times the stages).
    fn accumulate(&self, bufs: &mut PipeBuffers<B>, i: usize) -> anyhow::Result<()> {
        let range = stage_params(self.stage.place.stage);
        let grads = bufs.grads.as_ref().context("training buffers")?;
        let mut host = vec![0.0_f32; range.len()];
        self.b.read_range(grads, range, &mut host)?;
        let scale = self.scale * bufs.micro[i].batch as f32;
        for (a, g) in bufs.acc.iter_mut().zip(&host) {
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

/// The whole of `storage`, into `out`.
fn read_all<B: Ops>(b: &B, storage: &B::Storage<f32>, out: &mut Vec<f32>) -> anyhow::Result<()> {
    out.resize(B::len(storage), 0.0);
    b.read_range(storage, 0..out.len(), out)?;
    Ok(())
}
