//! The test-set pass: each rank evaluates every `world_size`-th sample,
//! without dropout, in batches whose size only changes memory use. The
//! stages of a pipeline evaluate together: each of them goes through the
//! samples of all its pipeline's ranks, each rank's in turn, in the same
//! batches as a data-parallel rank of that number would.

use std::ops::Range;

use std::collections::HashMap;

use core_tensor::Ops;

use super::meter::read_scalar;
use crate::data::{Batches, Order};
use crate::model::{Mode, Model};

const EVAL_BATCH: usize = 256;

pub(super) struct Evaluator<B: Ops, M: Model<B>> {
    test: Box<dyn Batches<B, M::Buffers>>,
    /// The samples this rank goes through, shard after shard.
    orders: Vec<Order>,
    sum: B::Storage<f32>,
    /// Evaluation buffers per batch size (no gradient buffers).
    buffers: HashMap<usize, M::Buffers>,
}

impl<B: Ops, M: Model<B>> Evaluator<B, M> {
    /// The pass over the shards of ranks `shards` (this rank's own, or
    /// its pipeline's) of `world_size`.
    pub fn new(
        backend: &B,
        test: Box<dyn Batches<B, M::Buffers>>,
        shards: Range<usize>,
        world_size: usize,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            test,
            orders: shards
                .map(|rank| Order::Strided { rank, world_size })
                .collect(),
            sum: backend.zeros(1)?,
            buffers: HashMap::new(),
        })
    }

    /// Samples in the test set, over all ranks.
    pub fn total(&self) -> usize {
        self.test.sample_count()
    }

    /// The [`Model::metric`] sum of `model` with `params` over this rank's
    /// samples (the same ones, in the same order, every time; a pipeline's
    /// last stage counts its pipeline's).
    pub fn metric_sum(
        &mut self,
        backend: &B,
        model: &M,
        params: &B::Storage<f32>,
    ) -> anyhow::Result<f64> {
        backend.fill(&mut self.sum, 0.0)?;
        for order in &self.orders {
            let sizes = self.test.start_epoch(backend, order, 1, EVAL_BATCH)?;
            for (step, n) in sizes.into_iter().enumerate() {
                let mut buffers = match self.buffers.remove(&n) {
                    Some(b) => b,
                    None => super::room::new_buffers(model, backend, n, false)?,
                };
                self.test.fill(backend, step, &mut buffers)?;
                model.forward(backend, &mut buffers, params, Mode::Eval)?;
                model.metric_sum(backend, &buffers, &mut self.sum)?;
                self.buffers.insert(n, buffers);
            }
        }
        read_scalar(backend, &self.sum)
    }
}
