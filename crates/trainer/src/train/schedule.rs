//! How one optimizer step runs the model over a batch: the whole model on
//! this rank ([`WholeModel`], data parallelism), or this rank's stage of a
//! pipeline (`crate::pipeline`). A schedule owns the model's data splits
//! and the buffers they fill; the step around it (averaging, optimizer,
//! guard) is the same for every schedule.

use std::ops::Range;

use core_tensor::Ops;

use super::memory::EpochBatches;
use crate::comm_thread::CommThread;
use crate::data::{DataFingerprint, Order};
use crate::model::{DropoutSeed, GradsReady, Model};
use crate::phases::StepTimer;

/// What a training pass over a batch reads and writes besides the model
/// and its buffers.
pub struct Pass<'a, B: Ops> {
    pub params: &'a B::Storage<f32>,
    /// The gradients of the parameters this rank trains, overwritten.
    pub grads: &'a mut B::Storage<f32>,
    pub dropout_seed: DropoutSeed,
    /// The epoch's device accumulators: the summed loss and metric.
    pub loss_sum: &'a mut B::Storage<f32>,
    pub metric_sum: &'a mut B::Storage<f32>,
    /// Where the step's time goes: the schedule marks its phases.
    pub timer: &'a mut StepTimer<B>,
    /// Told as each bucket of gradients is final (the averaging).
    pub hook: &'a mut dyn GradsReady<B>,
}

/// The part of the parameters a rank trains when it trains a part (a
/// pipeline stage): every part's range, in order, and which one is its.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub ranges: Vec<Range<usize>>,
    pub mine: usize,
}

impl Part {
    /// The range this rank trains.
    pub fn range(&self) -> Range<usize> {
        self.ranges[self.mine].clone()
    }
}

/// A way of running a model over its batches (see the module docs).
pub trait Schedule<B: Ops, M: Model<B>> {
    /// The training split's samples, as a checkpoint records them.
    fn fingerprint(&self) -> DataFingerprint;

    /// Samples of the test split over all ranks (`None`: no test split).
    fn test_samples(&self) -> Option<usize>;

    /// Agrees with the other ranks, before training batches of `batch`,
    /// on what depends on them (a pipeline's cut); `job` is the job's
    /// communicator.
    fn settle(
        &mut self,
        _b: &B,
        (_model, _batch): (&M, usize),
        _job: Option<&mut CommThread>,
    ) -> anyhow::Result<()> {
        Ok(())
    }

    /// With `--reproducible`, before [`Schedule::settle`]: from now on a
    /// step trains this replica's `units` units of `unit` samples each
    /// alone, each one's gradients told whole (`pass.hook` at offset 0)
    /// before the next one's. Returns how many units one batch holds: 1
    /// (a pass a unit), or all of them (a pipeline's micro-batches).
    fn train_units(&mut self, (_unit, _units): (usize, usize)) -> anyhow::Result<usize> {
        Ok(1)
    }

    /// The part of the parameters this rank trains (`None`: all).
    fn part(&self) -> Option<Part> {
        None
    }

    /// Starts training `epoch` (from 1) of the samples `order` gives this
    /// rank: the size of each batch of at most `batch`, in order.
    fn start_epoch(
        &mut self,
        b: &B,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>>;

    /// Makes the buffers of the training batches of `sizes` it has none
    /// for, once they are known to fit (`memory.rs`), before the epoch's
    /// first step: `epoch` says what its batches are.
    fn prepare(
        &mut self,
        b: &B,
        model: &M,
        batches: (&[usize], &EpochBatches),
    ) -> anyhow::Result<()>;

    /// Fills `batch` `(step, n)`: batch `step` (of `n` samples) of the
    /// epoch started last, and
    /// runs the model's passes over it: the loss and metric into the
    /// epoch's sums, every gradient into `pass.grads`.
    fn train(
        &mut self,
        b: &B,
        model: &M,
        batch: (usize, usize),
        pass: Pass<'_, B>,
    ) -> anyhow::Result<()>;

    /// The rows of the model's row tables the last batch of `n` looked up
    /// (a model with row tables).
    fn batch_rows(&self, model: &M, n: usize) -> Option<&[u32]>;

    /// Adds the model's metric `at` `(params, orders)`: over the test
    /// samples `orders` give this rank, with `params`, to `sum`.
    fn evaluate(
        &mut self,
        b: &B,
        model: &M,
        at: (&B::Storage<f32>, &[Order]),
        sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()>;
}
