//! The whole model on this rank, over a batch at a time: what every
//! data-parallel rank runs.

use std::collections::HashMap;

use anyhow::Context;
use core_tensor::Ops;

use super::memory::{EVAL_BATCH, EpochBatches, test_buffers, test_reserve, training_buffers};
use super::schedule::{Pass, Schedule};
use crate::data::{Batches, DataFingerprint, Order};
use crate::model::{Mode, Model};
use crate::phases::Phase;

/// A model's data splits and the buffers they fill, per batch size.
pub struct WholeModel<B: Ops, M: Model<B>> {
    train: Box<dyn Batches<B, M::Buffers>>,
    test: Option<Box<dyn Batches<B, M::Buffers>>>,
    /// Training buffers per batch size (the full batch, the last one).
    buffers: HashMap<usize, M::Buffers>,
    /// Test buffers per batch size (no gradients).
    eval: HashMap<usize, M::Buffers>,
}

impl<B: Ops, M: Model<B>> WholeModel<B, M> {
    /// Trains on `train`, evaluates on `test` (`None`: no test split).
    pub fn new(
        train: Box<dyn Batches<B, M::Buffers>>,
        test: Option<Box<dyn Batches<B, M::Buffers>>>,
    ) -> Self {
        Self {
            train,
            test,
            buffers: HashMap::new(),
            eval: HashMap::new(),
        }
    }
}

impl<B: Ops, M: Model<B>> Schedule<B, M> for WholeModel<B, M> {
    fn fingerprint(&self) -> DataFingerprint {
        self.train.fingerprint()
    }

    fn test_samples(&self) -> Option<usize> {
        self.test.as_ref().map(|t| t.sample_count())
    }

    fn start_epoch(
        &mut self,
        b: &B,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>> {
        self.train.start_epoch(b, order, epoch, batch)
    }

    fn prepare(
        &mut self,
        b: &B,
        model: &M,
        (sizes, epoch): (&[usize], &EpochBatches),
    ) -> anyhow::Result<()> {
        let mut new: Vec<usize> = (sizes.iter().copied())
            .filter(|n| !self.buffers.contains_key(n))
            .collect();
        new.sort_unstable_by(|a, b| b.cmp(a));
        new.dedup();
        if new.is_empty() {
            return Ok(());
        }
        let make_test = |n| model.buffers(b, n, false);
        let reserve = match self.test {
            Some(_) => test_reserve(b, epoch, |n| self.eval.contains_key(&n), make_test)?,
            None => 0,
        };
        let make = |n| model.buffers(b, n, true);
        let made = training_buffers(b, (&new, epoch), (1, reserve), make)?;
        self.buffers.extend(new.into_iter().zip(made));
        Ok(())
    }

    fn train(
        &mut self,
        b: &B,
        model: &M,
        (step, n): (usize, usize),
        pass: Pass<'_, B>,
    ) -> anyhow::Result<()> {
        let buffers = (self.buffers.get_mut(&n))
            .with_context(|| format!("no buffers for a batch of {n}: prepare the epoch first"))?;
        let Pass {
            params,
            grads,
            dropout_seed,
            loss_sum,
            metric_sum,
            timer,
            hook,
        } = pass;
        timer.enter(Phase::Data)?;
        self.train.fill(b, step, buffers)?;
        timer.enter(Phase::Forward)?;
        model.forward(b, buffers, params, Mode::Train { dropout_seed })?;
        model.metric_sum(b, buffers, metric_sum)?;
        model.loss(b, buffers, loss_sum)?;
        // Each bucket of gradients starts its averaging as soon as
        // backward has written it.
        timer.enter(Phase::Backward)?;
        model.backward(b, buffers, params, grads, dropout_seed, hook)
    }

    fn batch_rows(&self, model: &M, n: usize) -> Option<&[u32]> {
        Some(model.row_tables()?.rows(self.buffers.get(&n)?))
    }

    fn evaluate(
        &mut self,
        b: &B,
        model: &M,
        (params, orders): (&B::Storage<f32>, &[Order]),
        sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        let Some(test) = self.test.as_mut() else {
            return Ok(());
        };
        for order in orders {
            let sizes = test.start_epoch(b, order, 1, EVAL_BATCH)?;
            for (step, n) in sizes.into_iter().enumerate() {
                let buffers = match self.eval.entry(n) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        e.insert(test_buffers(n, |n| model.buffers(b, n, false))?)
                    }
                };
                test.fill(b, step, buffers)?;
                model.forward(b, buffers, params, Mode::Eval)?;
                model.metric_sum(b, buffers, sum)?;
            }
        }
        Ok(())
    }
}
