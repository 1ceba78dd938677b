//! The test-set pass: each rank evaluates every `world_size`-th sample,
//! without dropout, in batches whose size only changes memory use.

use std::collections::HashMap;

use core_tensor::Ops;
use fashion_mnist::Split;

use super::meter::read_scalar;
use crate::data::{DeviceSplit, to_device_indices};
use crate::model::{Mode, Model};

const EVAL_BATCH: usize = 256;

pub(super) struct Evaluator<B: Ops, M: Model<B>> {
    test: DeviceSplit<B>,
    /// This rank's samples, on the device.
    indices: B::Storage<u32>,
    count: usize,
    correct: B::Storage<f32>,
    /// Evaluation buffers per batch size (no gradient buffers).
    buffers: HashMap<usize, M::Buffers>,
}

impl<B: Ops, M: Model<B>> Evaluator<B, M> {
    pub fn new(backend: &B, split: &Split, rank: usize, world_size: usize) -> anyhow::Result<Self> {
        let mine: Vec<usize> = (rank..split.len).step_by(world_size).collect();
        Ok(Self {
            test: DeviceSplit::upload(backend, split, "test")?,
            indices: to_device_indices(backend, &mine)?,
            count: mine.len(),
            correct: backend.zeros(1)?,
            buffers: HashMap::new(),
        })
    }

    /// Samples in the test set, over all ranks.
    pub fn total(&self) -> usize {
        self.test.len
    }

    /// How many of this rank's samples `model` with `params` classifies
    /// correctly.
    pub fn count_correct(
        &mut self,
        backend: &B,
        model: &M,
        params: &B::Storage<f32>,
    ) -> anyhow::Result<f64> {
        backend.fill(&mut self.correct, 0.0)?;
        for start in (0..self.count).step_by(EVAL_BATCH) {
            let positions = start..(start + EVAL_BATCH).min(self.count);
            let n = positions.len();
            let mut buffers = match self.buffers.remove(&n) {
                Some(b) => b,
                None => model.buffers(backend, n, false)?,
            };
            let (x, labels) = model.inputs(&mut buffers);
            self.test
                .gather(backend, &self.indices, positions, x, labels)?;
            model.forward(backend, &mut buffers, params, Mode::Eval)?;
            model.count_correct(backend, &buffers, &mut self.correct)?;
            self.buffers.insert(n, buffers);
        }
        read_scalar(backend, &self.correct)
    }
}
