//! Pipeline parallelism for the CNN (`--pipeline-stages 2`): the network
//! cut where the convolution stack meets the fully connected stack, one
//! stage per rank, a batch split into micro-batches that flow through the
//! stages on a 1F1B schedule (`schedule.rs`): activations forward, their
//! gradients backward, over the pipeline's own communicator (a sub-group).
//!
//! A stage is a [`Model`], so the trainer drives it like any other: the
//! schedule runs inside [`Model::forward`], and [`Model::backward`] hands
//! the stage's accumulated gradients to the trainer's averaging. The stage
//! is a [`Partition`] of the parameters: its rank's gradient buffer, the
//! DDP buckets and Adam's state cover the stage's range
//! ([`stage_params`]) only, averaged over the stage's data-parallel group
//! (stage `s` of every pipeline, a sub-group communicator; with one
//! replica nothing is averaged and no communicator is called), and only
//! that range is stepped. The rank's device holds that range of the
//! parameters and nothing of the others: the stage's layers read it at
//! offsets less its start ([`CnnMnist::within`]). Its buffers
//! ([`PipeBuffers`]) are likewise its own layers' activations and the
//! cut's only, for the micro-batches in flight only. Evaluation goes through
//! the pipeline as training does, a whole test batch at a time (stage 0's
//! features, the last stage's head and count). The whole model is made
//! only on rank 0's host, at a checkpoint: each stage's part (and Adam's
//! moments) broadcast from the first replica's rank of that stage. So
//! checkpoints stay whole models saved by rank 0, exactly as a
//! data-parallel run writes them, and any layout resumes any other (each
//! stage uploads its part of the loaded whole).
//!
//! Ranks: pipeline `p` is ranks `p*S .. p*S + S` (stage = rank mod S), so
//! a pipeline's stages sit on one machine when the ranks per machine are a
//! multiple of `S`; stage `s` of every pipeline forms its data-parallel
//! group ([`PipelinePlace::replica_group`]).

mod buffers;
mod link;
mod schedule;

pub use buffers::PipeBuffers;
pub use link::{HostLink, NcclLink, StageLink};

use std::cell::RefCell;
use std::ops::Range;
use std::time::Duration;

use anyhow::bail;
use core_tensor::{FlatLayout, Ops, Result};

use crate::model::{GradsReady, Metric, Mode, Model, Partition};
use crate::models::cnn::{CnnMnist, IMAGE_SIDE, cnn_layout};
use crate::phases::PhaseSeconds;
use crate::phases::{Phase, StepTimer};
use crate::train::DataShare;
use buffers::StageActs;

/// The pipeline's flags.
#[derive(Clone, Debug, clap::Args)]
pub struct PipelineFlags {
    /// Pipeline parallelism: split the model into S stages, one per rank
    /// (S = 2 for this CNN: the convolution stack, the fully connected
    /// stack); the world is S x data-parallel replicas.
    #[arg(long, value_name = "S", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub pipeline_stages: u32,

    /// Micro-batches per batch in a pipeline (1F1B schedule).
    #[arg(long, value_name = "M", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub micro_batches: u32,
}

/// Where a rank sits in a `stages x replicas` layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipelinePlace {
    pub stages: usize,
    pub stage: usize,
    pub replica: usize,
    pub replicas: usize,
}

impl PipelinePlace {
    /// Rank `rank` of `world` in pipelines of `stages` stages.
    pub fn of(rank: usize, world: usize, stages: usize) -> anyhow::Result<Self> {
        if stages != 2 {
            bail!(
                "--pipeline-stages {stages}: this CNN splits into 2 stages (the convolution stack and the fully connected stack); use 2"
            );
        }
        if !world.is_multiple_of(stages) {
            bail!(
                "world size {world} is not a multiple of --pipeline-stages {stages}: the world is stages x data-parallel replicas"
            );
        }
        Ok(Self {
            stages,
            stage: rank % stages,
            replica: rank / stages,
            replicas: world / stages,
        })
    }

    /// The job ranks of this rank's pipeline, in stage order.
    pub fn members(&self) -> Vec<usize> {
        (self.replica * self.stages..(self.replica + 1) * self.stages).collect()
    }

    /// The job ranks of this rank's stage in every pipeline (its
    /// data-parallel group), in replica order.
    pub fn replica_group(&self) -> Vec<usize> {
        (0..self.replicas)
            .map(|r| r * self.stages + self.stage)
            .collect()
    }

    /// The samples this rank trains on: its replica's.
    pub fn share(&self) -> DataShare {
        DataShare {
            replica: self.replica,
            replicas: self.replicas,
            counts: self.stage + 1 == self.stages,
        }
    }
}

/// The parameters stage `stage` (of 2) trains.
pub fn stage_params(stage: usize) -> Range<usize> {
    let layout = cnn_layout();
    let cut = layout.range("fc1.weight").map_or(0, |r| r.start);
    if stage == 0 {
        0..cut
    } else {
        cut..layout.len()
    }
}

/// The split, for the start-up line: each stage's layers, parameters and
/// share of a sample's forward multiply-adds (the time balance: the cut
/// at the flatten is the only one between the two stacks, and it leaves
/// the convolutions with most of the work).
pub fn describe_split() -> String {
    let layout = cnn_layout();
    let weights = |name: &str| layout.range(name).map_or(0, |r| r.len());
    let side = |shrink: usize| (IMAGE_SIDE - shrink) * (IMAGE_SIDE - shrink);
    let convs = weights("conv1.weight") * side(2) + weights("conv2.weight") * side(4);
    let fcs = weights("fc1.weight") + weights("fc2.weight");
    let share = |part: usize| 100.0 * part as f64 / (convs + fcs) as f64;
    format!(
        "stage 0: conv1, conv2, pool ({} parameters, {:.1}% of the multiply-adds); stage 1: fc1, fc2, loss ({} parameters, {:.1}%)",
        stage_params(0).len(),
        share(convs),
        stage_params(1).len(),
        share(fcs)
    )
}

/// Where a stage's time went in the schedules so far, in device time: the
/// clock of the steps' `pipeline_wait` phase.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageTimes {
    /// Running the schedule, waits included.
    pub total: Duration,
    /// Waiting for the neighbouring stage (inside send/receive).
    pub waiting: Duration,
}

impl StageTimes {
    /// The stage's bubble: the fraction of the schedule it sat idle.
    pub fn idle_fraction(&self) -> f64 {
        self.waiting.as_secs_f64() / self.total.as_secs_f64().max(f64::MIN_POSITIVE)
    }

    /// Adds one schedule's phases.
    fn add(&mut self, schedule: &PhaseSeconds) {
        let seconds = |phase| Duration::from_secs_f64(schedule.get(phase));
        self.total += seconds(Phase::Forward) + seconds(Phase::Backward);
        self.total += seconds(Phase::PipelineWait);
        self.waiting += seconds(Phase::PipelineWait);
    }
}

/// One stage of the pipelined CNN on one rank (see the module docs).
pub struct PipelineStage<B: Ops> {
    /// The stage's layers, over its part of the parameters (the layout
    /// and initialisation are the whole network's).
    cnn: CnnMnist,
    place: PipelinePlace,
    micro_batches: usize,
    /// The way to the other stages: stage `s` is its rank `s`.
    link: RefCell<Box<dyn StageLink<B>>>,
    times: RefCell<StageTimes>,
    /// The schedule's phases in device time (forward work, backward work,
    /// waiting for the other stage), handed to the trainer after each
    /// schedule (`Model::forward_split`); made at the first schedule.
    phases: RefCell<Option<StepTimer<B>>>,
}

impl<B: Ops> PipelineStage<B> {
    /// Stage `place.stage` of `cnn`, reaching its neighbours over `link`,
    /// with `micro_batches` per batch.
    pub fn new(
        cnn: CnnMnist,
        place: PipelinePlace,
        micro_batches: usize,
        link: Box<dyn StageLink<B>>,
    ) -> anyhow::Result<Self> {
        if micro_batches == 0 {
            bail!("--micro-batches must be at least 1");
        }
        if link.world_size() != place.stages || link.rank() != place.stage {
            bail!(
                "the pipeline communicator has rank {} of {}, not stage {} of {}",
                link.rank(),
                link.world_size(),
                place.stage,
                place.stages
            );
        }
        Ok(Self {
            cnn: cnn.within(stage_params(place.stage)),
            place,
            micro_batches,
            link: RefCell::new(link),
            times: RefCell::new(StageTimes::default()),
            phases: RefCell::new(None),
        })
    }

    pub fn place(&self) -> PipelinePlace {
        self.place
    }

    /// Where this stage's time went so far.
    pub fn times(&self) -> StageTimes {
        *self.times.borrow()
    }

    /// The schedule enters `phase` (`None`: it ended).
    fn mark(&self, b: &B, phase: Option<Phase>) -> Result<()> {
        let mut timer = self.phases.borrow_mut();
        let timer = timer.get_or_insert_with(|| StepTimer::new(b.clone()));
        match phase {
            Some(phase) => timer.enter(phase),
            None => timer.end_step(),
        }
    }
}

impl<B: Ops> Model<B> for PipelineStage<B> {
    type Buffers = PipeBuffers<B>;

    /// The whole CNN, whose checkpoints any layout resumes.
    fn kind(&self) -> &'static str {
        Model::<B>::kind(&self.cnn)
    }

    fn metric(&self) -> Metric {
        Metric::Accuracy
    }

    fn layout(&self) -> &FlatLayout {
        cnn_layout()
    }

    fn init_params(&self, seed: u64) -> Vec<f32> {
        self.cnn.init_params(seed)
    }

    fn partition(&self) -> Option<Partition> {
        Some(Partition {
            parts: (0..self.place.stages).map(stage_params).collect(),
            part: self.place.stage,
            replicas: self.place.replicas,
        })
    }

    /// This stage's activations only: for training those of the
    /// micro-batches in flight, with gradients; for evaluation one set for
    /// the whole batch (see [`PipeBuffers`]).
    fn buffers(&self, b: &B, batch: usize, train: bool) -> Result<PipeBuffers<B>> {
        let sizes = match train {
            true => {
                let m = self.micro_batches.min(batch).max(1);
                let (base, extra) = (batch / m, batch % m);
                (0..m).map(|i| base + usize::from(i < extra)).collect()
            }
            false => vec![batch],
        };
        PipeBuffers::new(b, self.place.stage, &sizes, train)
    }

    fn forward(
        &self,
        b: &B,
        buffers: &mut PipeBuffers<B>,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()> {
        let done = match mode {
            Mode::Train { dropout_seed } => schedule::run(self, b, buffers, params, dropout_seed),
            Mode::Eval => schedule::evaluate(self, b, buffers, params),
        };
        // Forward returns kernel errors only: a communication failure
        // travels as its text.
        done.map_err(|e| core_tensor::Error::InvalidArgument {
            op: "pipeline schedule",
            reason: format!("{e:#}"),
        })
    }

    /// The last stage counts, over each micro-batch's logits (or the
    /// whole batch's), which it keeps past the micro-batch's slot.
    fn metric_sum(
        &self,
        b: &B,
        buffers: &PipeBuffers<B>,
        correct: &mut B::Storage<f32>,
    ) -> Result<()> {
        match &buffers.acts {
            StageActs::Front(..) => Ok(()),
            StageActs::Back(acts) => acts
                .micro
                .iter()
                .try_for_each(|m| m.count_correct(b, correct)),
        }
    }

    /// The last stage adds every micro-batch's loss (computed again, from
    /// the logits it keeps, in the micro-batch's slot: the schedule needed
    /// the gradients before the trainer asks for this).
    fn loss(
        &self,
        b: &B,
        buffers: &mut PipeBuffers<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        match &mut buffers.acts {
            StageActs::Front(..) => Ok(()),
            StageActs::Back(acts) => (0..acts.micro.len()).try_for_each(|i| {
                acts.start(i).head.loss(b, loss_sum)?;
                acts.finish(i);
                Ok(())
            }),
        }
    }

    /// Hands the accumulated gradients of this stage (`grads` is the
    /// stage's part: see [`Model::partition`]) to `hook` at once: they were
    /// final when the schedule ended.
    fn backward(
        &self,
        b: &B,
        buffers: &mut PipeBuffers<B>,
        _params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        _dropout_seed: u64,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        b.write_range(&buffers.scratch()?.acc, grads, 0)?;
        hook.ready(b, grads, 0)
    }

    /// The last schedule's backward passes and waits, which the trainer
    /// would otherwise count as forward. Its marks are ready: the schedule
    /// ends in a read of the device (stage 0's last gradients) or a
    /// completed exchange (stage 1).
    fn forward_split(&self, _b: &B) -> Result<Option<PhaseSeconds>> {
        let Some(timer) = self.phases.borrow_mut().as_mut().map(StepTimer::take) else {
            return Ok(None);
        };
        let schedule = timer?;
        self.times.borrow_mut().add(&schedule);
        Ok(Some(schedule))
    }
}
