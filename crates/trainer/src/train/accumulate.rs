//! `--accumulate-steps K` (PyTorch's `no_sync()`): an optimizer step of K
//! micro-batches. Each micro-batch's backward overwrites the gradients, so
//! its ranges are added, as backward finishes them, into the step's sum,
//! weighted by the micro-batch's share of the step's samples (the batch
//! mean, as one batch of K x `--batch-size` would have it). The first K - 1
//! micro-batches tell the averaging nothing; the last one's sum goes into
//! the gradients range by range, each handed on to the averaging at once,
//! so its all-reduce still overlaps its backward, as DDP's does after
//! `no_sync()`. A checkpoint is taken between optimizer steps only, when
//! the sum is empty: there is nothing between micro-batches to save.

use core_tensor::Ops;
use core_tensor::ops::SumInto;

use crate::model::{DropoutSeed, GradsReady};

/// The step's gradient sum over its micro-batches.
pub(super) struct Accumulator<B: Ops> {
    acc: B::Storage<f32>,
}

/// One micro-batch of an optimizer step.
#[derive(Clone, Copy, Debug)]
pub(super) struct Micro {
    /// The batch of the epoch it is.
    pub index: usize,
    pub samples: usize,
    pub dropout_seed: DropoutSeed,
}

impl<B: Ops> Accumulator<B> {
    /// The sum of `len` gradients.
    pub fn new(b: &B, len: usize) -> anyhow::Result<Self> {
        Ok(Self { acc: b.zeros(len)? })
    }

    /// What backward of micro-batch `at` (its position in the step) of
    /// `count`, holding `weight` of the step's samples, tells: `then`
    /// (the averaging) hears of the last micro-batch's ranges only.
    pub fn micro_batch<'a>(
        &'a mut self,
        b: &B,
        (at, count, weight): (usize, usize, f32),
        len: usize,
        then: &'a mut dyn GradsReady<B>,
    ) -> anyhow::Result<Adding<'a, B>> {
        if at == 0 {
            b.fill(&mut self.acc, 0.0)?;
        }
        let last = at + 1 == count;
        Ok(Adding {
            acc: &mut self.acc,
            weight,
            into: if last { SumInto::Grads } else { SumInto::Acc },
            done: len,
            then: last.then_some(then),
        })
    }
}

/// The hook of one micro-batch's backward (see the module docs).
pub(super) struct Adding<'a, B: Ops> {
    acc: &'a mut B::Storage<f32>,
    weight: f32,
    into: SumInto,
    /// Gradients from here to the end are added.
    done: usize,
    /// The averaging, for the last micro-batch.
    then: Option<&'a mut dyn GradsReady<B>>,
}

impl<B: Ops> GradsReady<B> for Adding<'_, B> {
    fn ready(&mut self, b: &B, grads: &mut B::Storage<f32>, offset: usize) -> anyhow::Result<()> {
        if offset < self.done {
            let range = offset..self.done;
            b.accumulate(self.weight, grads, self.acc, range, self.into)?;
            self.done = offset;
        }
        match &mut self.then {
            Some(then) => then.ready(b, grads, offset),
            None => Ok(()),
        }
    }
}

impl<B: Ops> Adding<'_, B> {
    /// After backward: adds what it did not report (a model reports every
    /// range down to 0, so normally nothing).
    pub fn finish(mut self, b: &B, grads: &mut B::Storage<f32>) -> anyhow::Result<()> {
        self.ready(b, grads, 0)
    }
}

/// The micro-batches `sizes` (an epoch's batches of `--batch-size`) in
/// optimizer steps of `k`, at most `max_steps` of them: each step's range
/// of `sizes`. The last step of an epoch may hold fewer micro-batches.
pub(super) fn steps_of(
    sizes: usize,
    k: usize,
    max_steps: Option<usize>,
) -> Vec<std::ops::Range<usize>> {
    let mut steps: Vec<_> = (0..sizes)
        .step_by(k.max(1))
        .map(|s| s..(s + k.max(1)).min(sizes))
        .collect();
    steps.truncate(max_steps.unwrap_or(usize::MAX));
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epochs_micro_batches_make_whole_steps_then_a_short_one() {
        assert_eq!(steps_of(10, 4, None), [0..4, 4..8, 8..10]);
        assert_eq!(steps_of(10, 4, Some(2)), [0..4, 4..8]);
        assert_eq!(steps_of(3, 1, None), [0..1, 1..2, 2..3]);
        assert!(steps_of(0, 4, None).is_empty());
    }
}
