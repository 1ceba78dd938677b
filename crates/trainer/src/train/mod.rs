//! The training loop of one rank: its replica of the parameters it trains
//! (the whole model, or a pipeline stage's part), its share of the data,
//! and for more than one replica the averaging of their gradients every
//! step.
//!
//! A [`Trainer`] is two parts. Its step engine (`engine/`) owns the
//! replica (`replica.rs`: parameters, gradients, moments, the finiteness
//! guard), an optimizer chosen once (`optimizer/`), a schedule that runs
//! the model over a batch (`schedule.rs`: the whole model,
//! `whole_model.rs`, or a pipeline stage, `crate::pipeline`), the averaging
//! (`crate::ddp::Averaging`) and the job's communicator, all private to it:
//! `engine/step.rs` is one optimizer step, top to bottom; `accumulate.rs`
//! the micro-batches of one step (`--accumulate-steps`); `engine/guard.rs`
//! the finiteness guard's report; `engine/assemble.rs` the whole model from
//! the parts of a pipeline's stages. The policy reads the engine and asks
//! it to act through its methods; it never reaches into its parts.
//! The epoch policy over it is the trainer's own, with the loop's state
//! between steps: `epoch_loop.rs` the loop over an epoch's steps (stop
//! votes, `votes.rs`; periodic checkpoints and what they gather,
//! `checkpointing.rs`; a live job's membership, `live.rs`); `meter.rs` the
//! epoch's running numbers; `agreement.rs` the check that every rank was
//! given rank 0's flags and data; `memory.rs` whether a batch's buffers fit.

mod accumulate;
mod agreement;
mod checkpointing;
mod config;
mod engine;
mod epoch_loop;
pub(crate) mod exact;
mod ledger;
mod live;
mod memory;
mod meter;
mod optimizer;
mod outcome;
mod replica;
mod schedule;
mod setup;
mod shared_settings;
mod votes;
mod whole_model;

use std::path::PathBuf;

use anyhow::{Context, bail};
use core_tensor::Ops;

pub use config::{TrainConfig, TrainFlags};
pub use exact::{BLOCK as EXACT_BLOCK, ExactRequest};
pub use ledger::{CommittedStep, SampleRecord};
pub use live::Membership;
pub use memory::{EVAL_BATCH, EpochBatches};
pub(crate) use memory::{host_room_bytes, test_buffers, test_reserve, training_buffers};
pub use outcome::{EpochReport, Progress, Regroup, RunOutcome, Running, Silent};
pub use schedule::{Part, Pass, Schedule};
pub use setup::{JobLinks, Setup};
pub use shared_settings::{
    GradientSettings, LayoutSettings, ModelSettings, ScheduleSettings, SharedSettings,
};
pub use whole_model::WholeModel;

use crate::checkpoint::{Checkpoints, Position};
use crate::data::{Batches, Order, Resumed};
use crate::model::{Metric, Model};
use crate::monitor::Monitor;
use crate::phases::StepTimer;
use crate::stop::StopRequest;
use crate::topology::Topology;
use engine::StepEngine;
pub use meter::EpochShare;
use meter::{EpochMeter, ResumePoint};
use votes::StopVotes;

/// One rank's training: the step engine (its replica and what steps it),
/// the epoch policy over it (the loop's state: stop votes, checkpoints,
/// the ledger, a live job's membership), the run's settings and where the
/// rank stands in the job.
pub struct Trainer<B: Ops, M: Model<B>> {
    /// First, so it is dropped first (see [`StepEngine`]'s averaging).
    engine: StepEngine<B, M>,
    cfg: TrainConfig,
    topology: Topology,
    state: LoopState<B>,
}

/// What the loop keeps between steps and epochs.
struct LoopState<B: Ops> {
    meter: EpochMeter<B>,
    timer: StepTimer<B>,
    votes: StopVotes,
    stop: StopRequest,
    checkpoints: Option<Checkpoints>,
    monitor: Monitor,
    /// The epoch training starts in, and where inside it (if not at step 0).
    first_epoch: usize,
    resume_at: Option<ResumePoint>,
    /// The newest end-of-epoch checkpoint this rank saved.
    last_saved: Option<PathBuf>,
    /// Where each committed step's samples go (`--sample-ledger`, rank 0).
    ledger: Option<Box<dyn SampleRecord>>,
    /// Where the last step committed here left the run.
    committed: Position,
    /// A member of a live job: what it carries and asks across generations.
    live: live::LiveState,
}

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// A replica of the whole `model`, trained on `train` and evaluated on
    /// `test` (`None` for a model without a metric).
    pub fn with_model(
        backend: B,
        model: M,
        train: Box<dyn Batches<B, M::Buffers>>,
        test: Option<Box<dyn Batches<B, M::Buffers>>>,
        cfg: TrainConfig,
        setup: Setup<B>,
    ) -> anyhow::Result<Self>
    where
        M: 'static,
        M::Buffers: 'static,
    {
        let schedule = Box::new(WholeModel::new(train, test));
        Self::with_schedule(backend, model, schedule, cfg, setup)
    }

    /// Reports `monitor`'s samples in every epoch's report (the default
    /// measures nothing but the phases).
    pub fn watch(&mut self, monitor: Monitor) {
        self.state.monitor = monitor;
    }

    /// Tells `ledger` every committed step's samples, the whole job's.
    pub fn record_samples(&mut self, ledger: Box<dyn SampleRecord>) {
        self.state.ledger = Some(ledger);
    }

    /// Optimizer steps trained so far (those of the run resumed included).
    pub fn global_step(&self) -> u64 {
        self.engine.global_step()
    }

    /// The newest checkpoint [`Trainer::run`] saved at an epoch's end
    /// (rank 0 with a checkpoint directory only).
    pub fn last_checkpoint(&self) -> Option<&std::path::Path> {
        self.state.last_saved.as_deref()
    }

    pub fn rank(&self) -> usize {
        self.topology.rank
    }

    pub fn model(&self) -> &M {
        self.engine.model()
    }

    /// The last epoch it trains.
    pub fn epochs(&self) -> usize {
        self.cfg.epochs
    }

    /// The epoch this replica starts (or resumes) in.
    pub fn first_epoch(&self) -> usize {
        self.state.first_epoch
    }

    /// The parameters this rank holds, copied to the host: the whole
    /// model, or for a model split between ranks its part (the whole:
    /// [`Trainer::whole_params`]).
    pub fn params(&self) -> anyhow::Result<Vec<f32>> {
        self.engine.host_params()
    }

    /// The whole model's parameters on the host of every rank. For a model
    /// split between ranks, every rank calls it: each part comes from the
    /// first replica's rank training it.
    pub fn whole_params(&mut self) -> anyhow::Result<Vec<f32>> {
        self.engine.whole_params(self.topology.rank)
    }

    /// The part of the parameters this rank trains (a pipeline stage's);
    /// `None`: all of them.
    pub fn part(&self) -> Option<Part> {
        self.engine.schedule().part()
    }

    /// This rank's samples of the training split: its replica's (of the
    /// rest of the epoch, when `resumed`).
    pub fn order(&self, resumed: Option<Resumed>) -> Order {
        match self.engine.exact() {
            // The steps are the global order's, whatever the layout: a
            // resumed epoch skips the steps done, on any number of replicas.
            Some(exact) => {
                let plan = exact.plan();
                Order::Units {
                    seed: self.cfg.seed,
                    global_batch: plan.global_batch,
                    unit: plan.unit,
                    share: (plan.share.start, plan.share.end),
                }
            }
            None => Order::Shuffled {
                rank: self.topology.replica(),
                world_size: self.topology.replicas(),
                seed: self.cfg.seed,
                resumed,
            },
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
        for epoch in self.state.first_epoch..=self.cfg.epochs {
            let report = match self.epoch(epoch, progress, &mut |_| Ok(()))? {
                epoch_loop::EpochEnd::Trained(report) => report,
                epoch_loop::EpochEnd::Stopped(outcome) => return Ok(outcome),
            };
            on_epoch(&report)?;
            let next = Position {
                epoch: epoch as u64 + 1,
                step: 0,
            };
            let saved = self.save_checkpoint(next)?;
            self.state.last_saved = saved.or(self.state.last_saved.take());
            self.state.committed = next;
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
            epoch_loop::EpochEnd::Trained(report) => Ok(report),
            epoch_loop::EpochEnd::Stopped(outcome) => {
                bail!(
                    "rank {}: epoch {epoch} stopped on request: {outcome:?}",
                    self.topology.rank
                )
            }
        }
    }

    /// The model's metric on the test set (accuracy for the CNN), each
    /// rank evaluating every `world`-th sample (a pipeline's stages its
    /// ranks' together, through the pipeline); `NaN` for a model without a
    /// metric or a test set, which skips the pass. Every rank calls it.
    pub fn evaluate(&mut self) -> anyhow::Result<f64> {
        let metric = self.engine.model().metric();
        let Some(total) =
            (self.engine.schedule().test_samples()).filter(|_| metric != Metric::None)
        else {
            return Ok(f64::NAN);
        };
        // A pipeline's stages go through its ranks' shards together.
        let world = self.topology.world;
        let orders: Vec<Order> = (self.topology.pipeline_members().into_iter())
            .map(|rank| Order::Strided {
                rank,
                world_size: world,
            })
            .collect();
        let sum = &mut self.state.meter.test_sum;
        self.engine.backend().fill(sum, 0.0)?;
        (self.engine.evaluate(&orders, sum))
            .with_context(|| format!("rank {}: evaluating", self.topology.rank))?;
        let local = meter::read_scalar(self.engine.backend(), sum)?;
        let sum = self.engine.sum_over_ranks(vec![local])?[0];
        Ok(metric.value(sum, total as f64))
    }

    /// The samples of each test shard [`Trainer::evaluate`] goes through
    /// on this rank (none without a test pass).
    fn test_shards(&self) -> Vec<usize> {
        let Some(len) = (self.engine.schedule().test_samples())
            .filter(|_| self.engine.model().metric() != Metric::None)
        else {
            return Vec::new();
        };
        let world = self.topology.world;
        (self.topology.pipeline_members().into_iter())
            .map(|rank| len.saturating_sub(rank).div_ceil(world))
            .collect()
    }
}
