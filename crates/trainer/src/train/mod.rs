//! The training loop of one rank: a full replica of the model, its shard of
//! the data, and (for more than one rank) gradient averaging every step.
//!
//! `step.rs` is one optimizer step, top to bottom; `epoch.rs` the loop over
//! an epoch's steps (stop requests, periodic checkpoints); `meter.rs` the
//! epoch's running numbers; `eval.rs` the test-set pass; `checkpointing.rs`
//! what a checkpoint gathers; `timer.rs` where a step's time goes;
//! `config.rs` the loop's settings; `lazy_adam.rs` the `--sparse-adam` step.

mod checkpointing;
mod config;
mod epoch;
mod eval;
mod guard;
mod lazy_adam;
mod meter;
mod parts;
mod replica;
mod room;
mod setup;
mod shared_flags;
mod step;

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{Context, bail};
use core_tensor::Ops;

pub use config::{TrainConfig, TrainFlags};
pub(crate) use room::host_room_bytes;
pub use setup::{DataShare, Setup};

use crate::checkpoint::origin;
use crate::checkpoint::{Checkpoints, Position};
use crate::comm_thread::CommThread;
use crate::data::{Batches, Order};
use crate::ddp::Reducer;
use crate::model::{Metric, Model};
use crate::monitor::{Monitor, RankStats, Straggler};
use crate::phases::StepTimer;
use crate::stop::StopRequest;
use eval::Evaluator;
use lazy_adam::LazyAdam;
use meter::{EpochMeter, ResumePoint};
use replica::Replica;
use shared_flags::Agreed;

/// One epoch's numbers, already reduced over all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    pub epoch: usize,
    pub epochs: usize,
    /// Mean training loss per sample.
    pub loss: f64,
    /// What `accuracy` and `test_accuracy` hold: the model's metric
    /// (`NaN` both for [`Metric::None`]).
    pub metric: Metric,
    pub accuracy: f64,
    pub test_accuracy: f64,
    /// Seconds spent training (evaluation excluded).
    pub train_seconds: f64,
    /// Training images per second, all ranks together.
    pub images_per_second: f64,
    pub steps: usize,
    pub images: u64,
    /// Optimizer steps since training began, at the end of this epoch.
    pub global_step: u64,
    /// Every rank's resource use and where its time went (device time: the
    /// work itself on a CPU, CUDA events on a GPU), in rank order.
    pub ranks: Vec<RankStats>,
    /// The rank far behind the others doing the same work, if one is.
    pub straggler: Option<Straggler>,
}

/// How a run ended.
#[derive(Clone, Debug, PartialEq)]
pub enum RunOutcome {
    /// Every epoch trained.
    Completed,
    /// All ranks stopped at `at` on a preemption request; rank 0 saved the
    /// checkpoint `saved` there (`None`: no checkpoint directory, or another
    /// rank).
    Preempted {
        at: Position,
        saved: Option<PathBuf>,
    },
    /// This rank stopped at `at` on an interrupt, saving nothing.
    Interrupted { at: Position },
}

/// Per-step progress, for a progress bar.
pub trait Progress {
    /// An epoch of `steps` steps begins, at step `done` (a resumed run
    /// starts part-way through; 0 otherwise).
    fn start_epoch(&mut self, epoch: usize, steps: usize, done: usize);
    fn step(&mut self);
    fn finish_epoch(&mut self);
    /// Every how many optimizer steps [`Progress::running`] wants this
    /// rank's running numbers (`None`: never). Backends outside host memory
    /// skip them: reading would wait for the device.
    fn running_every(&self) -> Option<u64> {
        None
    }
    fn running(&mut self, _numbers: &Running) {}
}

/// This rank's numbers since its epoch began, mid-epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Running {
    /// Optimizer steps since training began (over all epochs).
    pub global_step: u64,
    /// Mean loss per sample and accuracy of this rank's samples so far.
    pub loss: f64,
    pub accuracy: f64,
    /// Images this epoch so far, all ranks together (assuming equal shards).
    pub images: u64,
    /// The epoch's training seconds when `images` was counted (a resumed
    /// run's seconds before it included, checkpoint pauses not): the rate
    /// is `images / train_seconds`, as in the epoch line.
    pub train_seconds: f64,
}

/// No progress display (other ranks, non-terminal output, tests).
pub struct Silent;
impl Progress for Silent {
    fn start_epoch(&mut self, _: usize, _: usize, _: usize) {}
    fn step(&mut self) {}
    fn finish_epoch(&mut self) {}
}

/// One rank's replica and optimizer state, and what it trains on.
pub struct Trainer<B: Ops, M: Model<B>> {
    /// First, so it is dropped first: an NCCL hook makes the compute
    /// stream wait for its collectives before the gradients are freed.
    reducer: Option<Reducer<B>>,
    /// The host communicator; `None` for one rank.
    comm: Option<CommThread>,
    /// The sub-group communicator whose thread serves the reducer's hook
    /// for a partitioned model (see [`Setup::group`]), held so that it is
    /// joined after the reducer is gone.
    _group: Option<CommThread>,
    backend: B,
    model: M,
    cfg: TrainConfig,
    rank: usize,
    world_size: usize,
    replica: Replica<B>,
    train: Box<dyn Batches<B, M::Buffers>>,
    /// The lazy update of the row tables (`--sparse-adam`).
    lazy_adam: Option<LazyAdam<B>>,
    /// Training buffers per batch size (the full batch, the last partial one).
    buffers: HashMap<usize, M::Buffers>,
    meter: EpochMeter<B>,
    /// The test-set pass; `None` without a test set.
    evaluator: Option<Evaluator<B, M>>,
    /// The epoch training starts in, and where inside it (if not at step 0).
    first_epoch: usize,
    resume_at: Option<ResumePoint>,
    checkpoints: Option<Checkpoints>,
    stop: StopRequest,
    timer: StepTimer<B>,
    monitor: Monitor,
    /// The newest end-of-epoch checkpoint this rank saved.
    last_saved: Option<PathBuf>,
    share: DataShare,
}

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// A replica of `model`, trained on `train` and evaluated on `test`
    /// (`None` for a model without a metric).
    pub fn with_model(
        backend: B,
        mut model: M,
        train: Box<dyn Batches<B, M::Buffers>>,
        test: Option<Box<dyn Batches<B, M::Buffers>>>,
        cfg: TrainConfig,
        setup: Setup<B>,
    ) -> anyhow::Result<Self> {
        if cfg.batch_size == 0 || cfg.epochs == 0 {
            bail!("the batch size and the number of epochs must be at least 1");
        }
        cfg.adam.validate()?;
        let Setup {
            mut comm,
            origin,
            device_hook,
            group,
            checkpoints,
            stop,
            share,
            shared_flags,
        } = setup;
        let (rank, world_size) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
        let share = share.unwrap_or(DataShare {
            replica: rank,
            replicas: world_size,
            counts: true,
        });
        if let Some(comm) = comm.as_mut() {
            // Each rank reads its own copy of the data (another host's may
            // differ): the replicas must train on the same samples.
            let mut agreed: Vec<_> = shared_flags.into_iter().map(Agreed::flag).collect();
            agreed.push(Agreed::training_data(train.fingerprint()));
            shared_flags::check(comm, &agreed)
                .with_context(|| format!("rank {rank}: checking the flags against rank 0's"))?;
        }
        let layout = model.layout();
        let start = origin::agree(
            origin,
            comm.as_mut(),
            || model.init_params(cfg.seed),
            layout.len(),
        )
        .with_context(|| format!("rank {rank}: agreeing on the starting point"))?;
        let reducer = parts::plan_reducer(
            &backend,
            &model,
            &cfg,
            device_hook,
            comm.as_ref(),
            group.as_ref(),
        )
        .with_context(|| format!("rank {rank}: planning the gradient averaging"))?;
        let lazy_adam = LazyAdam::plan(&mut model, cfg.sparse_adam, reducer.as_ref(), world_size)
            .with_context(|| format!("rank {rank}: planning --sparse-adam"))?;
        let trained = model.partition().map(|p| p.mine());
        let resume_at = (start.position.step > 0).then(|| ResumePoint::of(&start));
        // A pipeline's stages evaluate its ranks' shards together.
        let stages = world_size / share.replicas.max(1);
        let shards = share.replica * stages..(share.replica + 1) * stages;
        Ok(Self {
            replica: Replica::upload(&backend, &start, trained)?,
            first_epoch: start.position.epoch as usize,
            resume_at,
            train,
            evaluator: test
                .map(|test| Evaluator::new(&backend, test, shards, world_size))
                .transpose()?,
            meter: EpochMeter::new(&backend)?,
            buffers: HashMap::new(),
            lazy_adam,
            checkpoints,
            stop,
            timer: StepTimer::new(backend.clone()),
            monitor: Monitor::off(),
            last_saved: None,
            share,
            reducer,
            comm,
            _group: group,
            backend,
            model,
            cfg,
            rank,
            world_size,
        })
    }

    /// Reports `monitor`'s samples in every epoch's [`RankStats`] (the
    /// default measures nothing but the phases).
    pub fn watch(&mut self, monitor: Monitor) {
        self.monitor = monitor;
    }

    /// The newest checkpoint [`Trainer::run`] saved at an epoch's end
    /// (rank 0 with a checkpoint directory only).
    pub fn last_checkpoint(&self) -> Option<&std::path::Path> {
        self.last_saved.as_deref()
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    /// The last epoch it trains.
    pub fn epochs(&self) -> usize {
        self.cfg.epochs
    }

    /// The epoch this replica starts (or resumes) in.
    pub fn first_epoch(&self) -> usize {
        self.first_epoch
    }

    /// The parameters this rank holds, copied to the host: the whole
    /// model, or for a model split between ranks its part (the whole:
    /// [`Trainer::whole_params`]).
    pub fn params(&self) -> anyhow::Result<Vec<f32>> {
        Ok(self.backend.download(&self.replica.params)?)
    }

    /// This rank's samples of the training split: its replica's.
    pub fn order(&self) -> Order {
        Order::Shuffled {
            rank: self.share.replica,
            world_size: self.share.replicas,
            seed: self.cfg.seed,
        }
    }

    /// Trains from where this replica starts through epoch `cfg.epochs`,
    /// handing each epoch's report to `on_epoch`, then checkpointing; stops
    /// early when a stop is requested.
    pub fn run(
        &mut self,
        progress: &mut dyn Progress,
        on_epoch: &mut dyn FnMut(&EpochReport) -> anyhow::Result<()>,
    ) -> anyhow::Result<RunOutcome> {
        for epoch in self.first_epoch..=self.cfg.epochs {
            let report = match self.epoch(epoch, progress, &mut |_| Ok(()))? {
                epoch::EpochEnd::Trained(report) => report,
                epoch::EpochEnd::Stopped(outcome) => return Ok(outcome),
            };
            on_epoch(&report)?;
            let saved = self.save_checkpoint(Position {
                epoch: epoch as u64 + 1,
                step: 0,
            })?;
            self.last_saved = saved.or(self.last_saved.take());
        }
        Ok(RunOutcome::Completed)
    }

    /// Trains one epoch (numbered from 1) and evaluates on the test set; a
    /// replica resumed mid-epoch continues its first epoch where it stopped.
    /// `after_step` sees the replica after every step. A stop request ends
    /// it with an error.
    pub fn train_epoch(
        &mut self,
        epoch: usize,
        progress: &mut dyn Progress,
        after_step: &mut dyn FnMut(&Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<EpochReport> {
        match self.epoch(epoch, progress, after_step)? {
            epoch::EpochEnd::Trained(report) => Ok(report),
            epoch::EpochEnd::Stopped(outcome) => {
                bail!(
                    "rank {}: epoch {epoch} stopped on request: {outcome:?}",
                    self.rank
                )
            }
        }
    }

    /// The model's metric on the test set (accuracy for the CNN), each
    /// rank evaluating every `world_size`-th sample (a pipeline's stages
    /// its ranks' together, through the pipeline); `NaN` for a model
    /// without a metric or a test set, which skips the pass. Every rank
    /// calls it.
    pub fn evaluate(&mut self) -> anyhow::Result<f64> {
        let metric = self.model.metric();
        let Some(evaluator) = self.evaluator.as_mut().filter(|_| metric != Metric::None) else {
            return Ok(f64::NAN);
        };
        let local = evaluator.metric_sum(&self.backend, &self.model, &self.replica.params)?;
        let total = evaluator.total() as f64;
        let sum = self.sum_over_ranks(vec![local])?[0];
        Ok(metric.value(sum, total))
    }

    fn sum_over_ranks(&mut self, values: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        match &mut self.comm {
            Some(comm) => comm.sum_f64(values).context("reducing epoch metrics"),
            None => Ok(values),
        }
    }
}
