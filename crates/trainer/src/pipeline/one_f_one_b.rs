//! The 1F1B schedule of one batch's `M` micro-batches through stage `s`
//! of `S` (PipeDream-Flush, as Megatron-LM runs it): `S - s - 1` warm-up
//! forwards, then one forward and one backward in turn, then the backward
//! passes left.
//!
//! ```text
//! stage 0 of 2: F0 . F1 B0 F2 B1 ... F(M-1) B(M-2) . B(M-1)
//! stage 1 of 2: .  F0B0  F1B1  ...       F(M-1)B(M-1) .
//! ```
//!
//! Each exchange goes both ways with one neighbour in one `send_recv`
//! (activations of one micro-batch to the next stage with the gradient of
//! an earlier one back from it; a gradient to the previous stage with the
//! next activations from it), so that two stages that exchange cannot
//! deadlock. Each micro-batch's parameter gradients are added into the
//! stage's host accumulator scaled by `m / n` (`m` its samples, `n` the
//! batch's), in micro-batch order: the batch mean, which the trainer then
//! averages over the stage's replicas; with `--reproducible` each is a
//! unit, handed whole to the step's exact sum instead ([`MicroSum`]). The
//! last stage adds each micro-batch's loss and metric (the CNN's correct
//! predictions) to the epoch's sums, in micro-batch order.

use anyhow::Context;
use core_tensor::Ops;

use super::StageBuffersOf;
use super::link::StageLink;
use super::slots::StageAt;
use crate::model::layered::{Io, Layered};
use crate::model::{DropoutSeed, GradsReady, Mode};
use crate::phases::{Phase, StepTimer};

/// The stage's parameter gradients of one micro-batch, and their sum.
pub(super) struct GradScratch<B: Ops> {
    /// One micro-batch's gradients of the stage's parameters.
    pub grads: B::Storage<f32>,
    /// The stage's gradients summed over the micro-batches, on the host.
    pub acc: Vec<f32>,
    /// One micro-batch's gradients, read from the device.
    pub host: Vec<f32>,
}

impl<B: Ops> GradScratch<B> {
    /// The scratch of a stage of `len` parameters.
    pub fn new(b: &B, len: usize) -> core_tensor::Result<Self> {
        Ok(Self {
            grads: b.zeros(len)?,
            acc: vec![0.0; len],
            host: vec![0.0; len],
        })
    }
}

/// What becomes of each micro-batch's gradients of the stage's parameters.
pub(super) enum MicroSum<'a, B: Ops> {
    /// Scaled by each micro-batch's weight in the batch mean and added into
    /// the scratch's accumulator.
    Weighted(Vec<f32>),
    /// `--reproducible`: each micro-batch a unit, its gradients told whole
    /// (offset 0) to the step's exact sum.
    Units(&'a mut dyn GradsReady<B>),
}

/// Everything one batch's schedule reads besides the buffers.
pub(super) struct Cx<'a, B: Ops, M: Layered<B>> {
    pub b: &'a B,
    /// The stage's segments over its part of the parameters.
    pub model: &'a M,
    pub at: &'a StageAt,
    pub stage: usize,
    pub link: &'a mut dyn StageLink<B>,
    pub params: &'a B::Storage<f32>,
    pub timer: &'a mut StepTimer<B>,
    pub scratch: &'a mut GradScratch<B>,
    /// The epoch's sums the last stage adds to: loss, metric.
    pub sums: (&'a mut B::Storage<f32>, &'a mut B::Storage<f32>),
    /// Each micro-batch's dropout seed, and how its gradients are summed.
    pub seeds: Vec<DropoutSeed>,
    pub sum: MicroSum<'a, B>,
}

impl<'a, B: Ops, M: Layered<B>> Cx<'a, B, M> {
    /// One batch through this stage (see the module docs).
    pub fn train(&mut self, bufs: &mut StageBuffersOf<B, M>) -> anyhow::Result<()> {
        self.scratch.acc.fill(0.0);
        let m = bufs.micro.len();
        let warmup = (self.at.in_flight - 1).min(m);
        let rest = m - warmup;
        for i in 0..warmup {
            self.recv_forward(bufs, i)?;
            self.forward(bufs, i)?;
            self.send_forward(bufs, i)?;
        }
        if rest > 0 {
            self.recv_forward(bufs, warmup)?;
        }
        for k in 0..rest {
            let (i, j) = (warmup + k, k);
            self.forward(bufs, i)?;
            self.send_forward_recv_backward(bufs, i, j)?;
            self.backward(bufs, j)?;
            match k + 1 < rest {
                true => self.send_backward_recv_forward(bufs, j, i + 1)?,
                false => self.send_backward(bufs, j)?,
            }
        }
        for j in rest..m {
            self.recv_backward(bufs, j)?;
            self.backward(bufs, j)?;
            self.send_backward(bufs, j)?;
        }
        Ok(())
    }

    fn mode(&self, i: usize) -> Mode {
        Mode::Train {
            dropout_seed: self.seeds[i],
        }
    }

    /// Forward of micro-batch `i` through the stage's segments; on the
    /// last stage also its metric and its loss (whose gradient backward
    /// starts from).
    fn forward(&mut self, bufs: &mut StageBuffersOf<B, M>, i: usize) -> anyhow::Result<()> {
        self.timer.enter(Phase::Forward)?;
        forward_through(
            self.model,
            self.b,
            (self.at, bufs, i),
            self.params,
            self.mode(i),
        )?;
        if !self.at.last {
            return Ok(());
        }
        let micro = &bufs.micro[i];
        let n = micro.samples;
        let y = bufs.slots[micro.slot]
            .cuts
            .last()
            .context("a stage has a segment")?;
        let target = micro
            .targets
            .as_ref()
            .context("the last stage reads targets")?;
        let (loss_sum, metric_sum) = (&mut *self.sums.0, &mut *self.sums.1);
        (self.model).output_metric(self.b, n, (y, target), metric_sum)?;
        let grads = (bufs.grads.iter_mut())
            .find(|g| g.samples == n)
            .context("a pipeline schedule needs buffers built for training")?;
        let dy = grads.dcuts.last_mut().context("a stage has a segment")?;
        (self.model).output_loss(self.b, n, (y, target), dy, loss_sum)?;
        Ok(())
    }

    /// Backward of micro-batch `i` through the stage's segments, from the
    /// gradient of its output (received, or the loss's), its parameter
    /// gradients added into the accumulator.
    fn backward(&mut self, bufs: &mut StageBuffersOf<B, M>, i: usize) -> anyhow::Result<()> {
        self.timer.enter(Phase::Backward)?;
        let (at, b, seed) = (self.at, self.b, self.seeds[i]);
        let micro = &bufs.micro[i];
        let n = micro.samples;
        let slot = &mut bufs.slots[micro.slot];
        let grads = (bufs.grads.iter_mut())
            .find(|g| g.samples == n)
            .context("a pipeline schedule needs buffers built for training")?;
        let scratch = &mut self.scratch.grads;
        for (k, s) in at.segments.clone().enumerate().rev() {
            let x = match (k, &slot.input, &micro.inputs) {
                (0, Some(input), _) | (0, None, Some(input)) => input,
                (0, None, None) => anyhow::bail!("the first stage reads inputs"),
                _ => &slot.cuts[k - 1],
            };
            let (below, at_k) = grads.dcuts.split_at_mut(k);
            let dx = match k {
                0 => grads.dinput.as_mut(),
                _ => below.last_mut(),
            };
            let io = Io {
                x,
                y: &slot.cuts[k],
                dy: &mut at_k[0],
                dx,
            };
            let acts = &mut slot.acts[k];
            (self.model).backward_segment(b, (s, n), io, acts, self.params, scratch, seed)?;
        }
        self.accumulate(i)
    }

    /// Adds micro-batch `i`'s gradients of this stage's parameters into
    /// the accumulator, scaled to the batch mean (or hands them on, a
    /// unit's).
    fn accumulate(&mut self, i: usize) -> anyhow::Result<()> {
        let GradScratch { grads, acc, host } = &mut *self.scratch;
        let weight = match &mut self.sum {
            MicroSum::Weighted(weights) => weights[i],
            MicroSum::Units(hook) => return hook.ready(self.b, grads, 0),
        };
        self.b.read_range(grads, 0..host.len(), host)?;
        for (a, g) in acc.iter_mut().zip(host.iter()) {
            *a += g * weight;
        }
        Ok(())
    }

    /// Receives micro-batch `i`'s input from the previous stage.
    fn recv_forward(&mut self, bufs: &mut StageBuffersOf<B, M>, i: usize) -> anyhow::Result<()> {
        if self.at.first {
            return Ok(());
        }
        let slot = &mut bufs.slots[bufs.micro[i].slot];
        let input = slot
            .input
            .as_mut()
            .context("a later stage receives its input")?;
        self.exchange(self.stage - 1, None, Some(input))
    }

    /// Sends micro-batch `i`'s output to the next stage.
    fn send_forward(&mut self, bufs: &mut StageBuffersOf<B, M>, i: usize) -> anyhow::Result<()> {
        if self.at.last {
            return Ok(());
        }
        let slot = &bufs.slots[bufs.micro[i].slot];
        let output = slot.cuts.last().context("a stage has a segment")?;
        self.exchange(self.stage + 1, Some(output), None)
    }

    /// Sends micro-batch `i`'s output to the next stage and receives the
    /// gradient of micro-batch `j`'s from it.
    fn send_forward_recv_backward(
        &mut self,
        bufs: &mut StageBuffersOf<B, M>,
        i: usize,
        j: usize,
    ) -> anyhow::Result<()> {
        if self.at.last {
            return Ok(());
        }
        let n = bufs.micro[j].samples;
        let output =
            (bufs.slots[bufs.micro[i].slot].cuts.last()).context("a stage has a segment")?;
        let grads = (bufs.grads.iter_mut())
            .find(|g| g.samples == n)
            .context("a pipeline schedule needs buffers built for training")?;
        let doutput = grads.dcuts.last_mut().context("a stage has a segment")?;
        self.exchange(self.stage + 1, Some(output), Some(doutput))
    }

    /// Receives the gradient of micro-batch `j`'s output from the next
    /// stage.
    fn recv_backward(&mut self, bufs: &mut StageBuffersOf<B, M>, j: usize) -> anyhow::Result<()> {
        if self.at.last {
            return Ok(());
        }
        let grads = bufs.grads_of(j)?;
        let doutput = grads.dcuts.last_mut().context("a stage has a segment")?;
        self.exchange(self.stage + 1, None, Some(doutput))
    }

    /// Sends the gradient of micro-batch `j`'s input to the previous stage.
    fn send_backward(&mut self, bufs: &mut StageBuffersOf<B, M>, j: usize) -> anyhow::Result<()> {
        if self.at.first {
            return Ok(());
        }
        let grads = bufs.grads_of(j)?;
        let dinput = grads.dinput.as_ref().context("a later stage sends back")?;
        self.exchange(self.stage - 1, Some(dinput), None)
    }

    /// Sends the gradient of micro-batch `j`'s input to the previous stage
    /// and receives micro-batch `i`'s input from it.
    fn send_backward_recv_forward(
        &mut self,
        bufs: &mut StageBuffersOf<B, M>,
        j: usize,
        i: usize,
    ) -> anyhow::Result<()> {
        if self.at.first {
            return Ok(());
        }
        let n = bufs.micro[j].samples;
        let grads = (bufs.grads.iter())
            .find(|g| g.samples == n)
            .context("a pipeline schedule needs buffers built for training")?;
        let dinput = grads.dinput.as_ref().context("a later stage sends back")?;
        let slot = &mut bufs.slots[bufs.micro[i].slot];
        let input = slot
            .input
            .as_mut()
            .context("a later stage receives its input")?;
        self.exchange(self.stage - 1, Some(dinput), Some(input))
    }

    /// One exchange with stage `peer`, its wait marked.
    fn exchange(
        &mut self,
        peer: usize,
        send: Option<&B::Storage<f32>>,
        recv: Option<&mut B::Storage<f32>>,
    ) -> anyhow::Result<()> {
        self.timer.enter(Phase::PipelineWait)?;
        let stage = self.stage;
        (self.link)
            .exchange(self.b, peer, send, recv)
            .with_context(|| format!("pipeline stage {stage}: exchanging with stage {peer}"))
    }
}

/// Forward of micro-batch `i` through the segments of stage `at` (`model`
/// over the stage's part of the parameters).
pub(super) fn forward_through<B: Ops, M: Layered<B>>(
    model: &M,
    b: &B,
    (at, bufs, i): (&StageAt, &mut StageBuffersOf<B, M>, usize),
    params: &B::Storage<f32>,
    mode: Mode,
) -> anyhow::Result<()> {
    let micro = &bufs.micro[i];
    let n = micro.samples;
    let slot = &mut bufs.slots[micro.slot];
    for (k, s) in at.segments.clone().enumerate() {
        let (before, after) = slot.cuts.split_at_mut(k);
        let x = match (k, &slot.input, &micro.inputs) {
            (0, Some(input), _) | (0, None, Some(input)) => input,
            (0, None, None) => anyhow::bail!("the first stage reads inputs"),
            _ => &before[k - 1],
        };
        model.forward_segment(b, (s, n), x, &mut after[0], &mut slot.acts[k], params, mode)?;
    }
    Ok(())
}
