//! A pipeline stage's buffers: its own segments' activations and the cuts
//! around them, nothing of the other stages', and only for the
//! micro-batches the schedule has in flight.
//!
//! The activations live in slots that the micro-batches take in turn:
//! stage `s` of `S` has up to `S - s` micro-batches in flight (its warm-up
//! forwards and the one whose gradient it waits for), which are
//! consecutive, so micro-batch `i` takes slot `i mod (S - s)` (per size:
//! every op checks its buffers' lengths against the batch, and an uneven
//! split has two sizes). A stage runs one backward at a time, so the
//! gradients of its cuts are kept once per micro-batch size, not per slot;
//! a received gradient and a gradient to send are in them from the
//! exchange to the backward and from the backward to the next exchange.
//!
//! What a micro-batch reads of the data is its own for the whole step
//! ([`Micro`]): the first stage's inputs, the last stage's targets, which
//! the data set gathers into them before the schedule starts.

use anyhow::Context;
use core_tensor::{Elem, Ops, Result};

use crate::model::Layered;
use crate::model::layered::{BatchInputs, InputPart};

/// One micro-batch's own inputs: the first stage's (`width(0)` values a
/// sample) and the last stage's targets.
pub(super) struct Micro<B: Ops, T: Elem> {
    pub samples: usize,
    pub inputs: Option<B::Storage<f32>>,
    pub targets: Option<B::Storage<T>>,
    /// The slot it takes.
    pub slot: usize,
}

/// The activations of one micro-batch in flight.
pub(super) struct Slot<B: Ops, A> {
    /// The cut the stage receives (none on the first stage, which reads
    /// its micro-batch's inputs).
    pub input: Option<B::Storage<f32>>,
    /// The cut after each of the stage's segments: the last is what the
    /// stage sends on (the outputs on the last stage).
    pub cuts: Vec<B::Storage<f32>>,
    /// Each segment's own buffers.
    pub acts: Vec<A>,
}

/// The gradients of a slot's cuts, for micro-batches of one size.
pub(super) struct Grads<B: Ops> {
    pub samples: usize,
    /// The gradient of each of [`Slot::cuts`]: the last is what the stage
    /// receives (the outputs' gradient on the last stage).
    pub dcuts: Vec<B::Storage<f32>>,
    /// The gradient of [`Slot::input`], which the stage sends back.
    pub dinput: Option<B::Storage<f32>>,
}

/// A stage's buffers for one batch size (see the module docs), of a
/// model whose segments keep `A` and whose outputs are scored against `T`.
pub struct StageBuffers<B: Ops, A, T: Elem> {
    pub(super) micro: Vec<Micro<B, T>>,
    pub(super) slots: Vec<Slot<B, A>>,
    /// One set per micro-batch size; none for evaluation.
    pub(super) grads: Vec<Grads<B>>,
}

/// Where a stage sits: which segments it runs, first and last.
#[derive(Clone, Debug)]
pub(super) struct StageAt {
    pub segments: std::ops::Range<usize>,
    pub first: bool,
    pub last: bool,
    /// Micro-batches in flight at most: `stages - stage`.
    pub in_flight: usize,
}

impl<B: Ops, A, T: Elem> StageBuffers<B, A, T> {
    /// Buffers for micro-batches of `sizes` samples (one, the whole batch,
    /// for evaluation) of a stage `at` of `model`, with gradients when
    /// `train`.
    pub(super) fn new<M: Layered<B, Acts = A, Target = T>>(
        model: &M,
        b: &B,
        (at, sizes): (&StageAt, &[usize]),
        train: bool,
    ) -> Result<Self> {
        let mut keys: Vec<(usize, usize)> = Vec::new();
        let mut micro = Vec::with_capacity(sizes.len());
        for (i, &samples) in sizes.iter().enumerate() {
            let key = (samples, i % at.in_flight);
            let slot = keys.iter().position(|&k| k == key).unwrap_or(keys.len());
            if slot == keys.len() {
                keys.push(key);
            }
            micro.push(Micro {
                samples,
                inputs: at
                    .first
                    .then(|| b.zeros(samples * model.width(0)))
                    .transpose()?,
                targets: (at.last)
                    .then(|| b.zeros(samples * model.target_width()))
                    .transpose()?,
                slot,
            });
        }
        let cut = |k: usize, n: usize| b.zeros(n * model.width(k));
        let slots = keys
            .iter()
            .map(|&(n, _)| {
                Ok(Slot {
                    input: (!at.first).then(|| cut(at.segments.start, n)).transpose()?,
                    cuts: (at.segments.clone())
                        .map(|s| cut(s + 1, n))
                        .collect::<Result<_>>()?,
                    acts: (at.segments.clone())
                        .map(|s| model.acts(b, s, n, train))
                        .collect::<Result<_>>()?,
                })
            })
            .collect::<Result<_>>()?;
        let mut grads: Vec<Grads<B>> = Vec::new();
        for &n in sizes.iter().filter(|_| train) {
            if grads.iter().all(|g| g.samples != n) {
                grads.push(Grads {
                    samples: n,
                    dcuts: (at.segments.clone())
                        .map(|s| cut(s + 1, n))
                        .collect::<Result<_>>()?,
                    dinput: (!at.first).then(|| cut(at.segments.start, n)).transpose()?,
                });
            }
        }
        Ok(Self {
            micro,
            slots,
            grads,
        })
    }

    /// The gradients of micro-batch `i`'s size.
    pub(super) fn grads_of(&mut self, i: usize) -> anyhow::Result<&mut Grads<B>> {
        let samples = self.micro[i].samples;
        (self.grads.iter_mut())
            .find(|g| g.samples == samples)
            .context("a pipeline schedule needs buffers built for training")
    }
}

/// The data set fills each micro-batch's own buffers with what its stage
/// reads: the inputs on the first stage, the targets on the last.
impl<B: Ops, A, T: Elem> BatchInputs<B, T> for StageBuffers<B, A, T> {
    fn parts(&mut self) -> Vec<InputPart<'_, B, T>> {
        (self.micro.iter_mut())
            .map(|m| InputPart {
                samples: m.samples,
                inputs: m.inputs.as_mut(),
                targets: m.targets.as_mut(),
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "slots_tests.rs"]
mod tests;
