//! Pipeline parallelism (`--pipeline-stages S --micro-batches M`): a model
//! that can be cut ([`Layered`]: the CNN's four segments, the toy's two)
//! split into `S`
//! stages of contiguous segments, one per rank, a batch split into
//! micro-batches that flow through the stages on a 1F1B schedule
//! (`one_f_one_b.rs`): activations forward, their gradients backward, over
//! the pipeline's own communicator (a sub-group, or NCCL between GPUs,
//! `link.rs`). It is a [`Schedule`] of the trainer, beside the whole-model
//! one: the step around it (averaging, optimizer, guard) is the same.
//!
//! Where the stages cut the model is chosen from each segment's measured
//! time (`cuts.rs`), every rank agreeing. A stage trains its segments'
//! parameters only ([`Schedule::part`]): its rank's device holds that
//! range and its gradients and moments, its buckets cover it, averaged
//! over the stage's data-parallel group (stage `s` of every pipeline; with
//! one replica nothing is averaged). Its buffers (`slots.rs`) are its own
//! segments' activations and the cuts around them, only for the
//! micro-batches in flight. Evaluation goes through the pipeline as
//! training does, a whole test batch at a time. The whole model is made
//! only on rank 0's host, at a checkpoint (each stage's part broadcast
//! from its first replica's rank), so checkpoints stay whole models and any
//! layout resumes any other.
//!
//! With `--reproducible` a micro-batch is a unit (`crate::train::exact`):
//! a batch is the replica's units of a step, each micro-batch's dropout
//! masks keyed by its rows in the global batch as the whole model's are,
//! and each micro-batch's gradients of the stage's parameters handed whole
//! to the step's exact sum (over the stage's replicas), not added up in
//! float.

mod cuts;
mod link;
mod micro;
mod one_f_one_b;
mod slots;

pub use link::{HostLink, NcclLink, StageLink};
pub use micro::MICRO_BATCHES;
pub use slots::StageBuffers;

use std::collections::HashMap;
use std::ops::Range;

use anyhow::{Context, bail};
use core_tensor::Ops;

use crate::comm_thread::CommThread;
use crate::data::{Batches, DataFingerprint, Order};
use crate::model::Layered;
use crate::phases::Phase;
use crate::topology::Topology;
use crate::train::{
    EVAL_BATCH, EpochBatches, Part, Pass, Schedule, test_buffers, test_reserve, training_buffers,
};
use micro::Split;
use one_f_one_b::{Cx, GradScratch, MicroSum, forward_through};
use slots::StageAt;

/// The pipeline's flags.
#[derive(Clone, Debug, clap::Args)]
pub struct PipelineFlags {
    /// Pipeline parallelism: split the model into S stages, one per rank.
    ///
    /// At the cuts that balance their measured times (the CNN: up to 4,
    /// conv1 | conv2 | fc1 | fc2; the toy: 2, net1 | net2); the world is S
    /// x data-parallel replicas.
    #[arg(long, value_name = "S", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub pipeline_stages: u32,

    /// Micro-batches per batch in a pipeline (1F1B schedule) [default: 4].
    ///
    /// With --reproducible, one per unit: the replica's units of a step.
    #[arg(long, value_name = "M", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub micro_batches: Option<u32>,
}

impl PipelineFlags {
    /// Micro-batches per batch, given or by default (without
    /// `--reproducible`).
    pub fn micro_batch_count(&self) -> usize {
        self.micro_batches.map_or(MICRO_BATCHES, |m| m as usize)
    }
}

/// A layered model's data splits, filling a stage's buffers.
pub type StageData<B, M> = Box<dyn Batches<B, StageBuffersOf<B, M>>>;

/// A layered model's stage buffers.
pub type StageBuffersOf<B, M> = StageBuffers<B, <M as Layered<B>>::Acts, <M as Layered<B>>::Target>;

/// This rank's stage of a pipeline, as the trainer's schedule.
pub struct Pipeline<B: Ops, M: Layered<B>> {
    /// This rank's place: its stage of how many, its replica of how many.
    topology: Topology,
    split: Split,
    link: Box<dyn StageLink<B>>,
    train: StageData<B, M>,
    test: Option<StageData<B, M>>,
    /// Each stage's segments when pinned ([`Pipeline::with_cut`]);
    /// otherwise measured.
    cut: Option<Vec<Range<usize>>>,
    /// Settled with the other ranks before training.
    plan: Option<Plan<B, M>>,
}

/// The cut every rank agreed on, and what this stage made of it.
struct Plan<B: Ops, M: Layered<B>> {
    /// Each stage's segments, in order.
    runs: Vec<Range<usize>>,
    at: StageAt,
    /// The stage's segments over its part of the parameters.
    local: M,
    /// That part.
    part: Range<usize>,
    /// Training buffers per batch size, test buffers per batch size.
    buffers: HashMap<usize, StageBuffersOf<B, M>>,
    eval: HashMap<usize, StageBuffersOf<B, M>>,
    /// Made with the first training buffers.
    scratch: Option<GradScratch<B>>,
}

impl<B: Ops, M: Layered<B>> Pipeline<B, M> {
    /// The stage of `topology` reaching its neighbours over `link` (stage
    /// `s` its rank `s`), `micro_batches` per batch (`None`: not given,
    /// [`MICRO_BATCHES`]), on these splits.
    pub fn new(
        topology: &Topology,
        micro_batches: Option<usize>,
        link: Box<dyn StageLink<B>>,
        (train, test): (StageData<B, M>, Option<StageData<B, M>>),
    ) -> anyhow::Result<Self> {
        let (stage, stages) = (topology.stage(), topology.stages);
        if micro_batches == Some(0) {
            bail!("--micro-batches must be at least 1");
        }
        let split = Split::given(micro_batches);
        if link.world_size() != stages || link.rank() != stage {
            bail!(
                "the pipeline communicator has rank {} of {}, not stage {stage} of {stages}",
                link.rank(),
                link.world_size(),
            );
        }
        Ok(Self {
            topology: *topology,
            split,
            link,
            train,
            test,
            cut: None,
            plan: None,
        })
    }

    /// The pipeline cut as `runs` says (each stage's segments, in order),
    /// not at the measured times: a layout a test or a benchmark repeats.
    pub fn with_cut(self, runs: Vec<Range<usize>>) -> Self {
        Self {
            cut: Some(runs),
            ..self
        }
    }
}

impl<B: Ops, M: Layered<B>> Schedule<B, M> for Pipeline<B, M> {
    fn fingerprint(&self) -> DataFingerprint {
        self.train.fingerprint()
    }

    fn test_samples(&self) -> Option<usize> {
        self.test.as_ref().map(|t| t.sample_count())
    }

    /// A micro-batch a unit (see the module docs): this replica's `units`
    /// of a step make a batch.
    fn train_units(&mut self, (unit, units): (usize, usize)) -> anyhow::Result<usize> {
        self.split = self.split.into_units(unit, units)?;
        Ok(units)
    }

    /// Measures the segments, agrees on the cut with every rank over the
    /// job's communicator, and makes this stage's model.
    fn settle(
        &mut self,
        b: &B,
        (model, batch): (&M, usize),
        job: Option<&mut CommThread>,
    ) -> anyhow::Result<()> {
        let (stage, stages) = (self.topology.stage(), self.topology.stages);
        let segments = model.segments();
        if stages > segments {
            bail!(
                "--pipeline-stages {stages}: --model {} splits into at most {segments} stages",
                model.kind()
            );
        }
        let runs = match self.cut.take() {
            Some(runs) => cuts::check(&runs, stages, segments)?,
            None => {
                let micro = self.split.sizes(batch)[0];
                let mut times = cuts::measure(model, b, micro)?;
                if let Some(job) = job {
                    let world = job.world_size() as f64;
                    times = job.sum_f64(times)?.into_iter().map(|t| t / world).collect();
                }
                let runs = cuts::balanced(&times, stages);
                if self.topology.leads() {
                    tell!("{}", self.describe(model, &runs, &times));
                }
                runs
            }
        };
        let mine = runs[stage].clone();
        let part = segments_params(model, &mine);
        let at = StageAt {
            segments: mine,
            first: stage == 0,
            last: stage + 1 == stages,
            in_flight: stages - stage,
        };
        self.plan = Some(Plan {
            at,
            local: model.within(part.clone()),
            part,
            buffers: HashMap::new(),
            eval: HashMap::new(),
            scratch: None,
            runs,
        });
        Ok(())
    }

    fn part(&self) -> Option<Part> {
        let plan = self.plan.as_ref()?;
        let ranges = (plan.runs.iter())
            .map(|run| segments_params(&plan.local, run))
            .collect();
        Some(Part {
            ranges,
            mine: self.topology.stage(),
        })
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
        _model: &M,
        (sizes, epoch): (&[usize], &EpochBatches),
    ) -> anyhow::Result<()> {
        let split = self.split;
        let plan = (self.plan.as_mut()).context("the pipeline trains once its cut is settled")?;
        let mut new: Vec<usize> = (sizes.iter().copied())
            .filter(|n| !plan.buffers.contains_key(n))
            .collect();
        new.sort_unstable_by(|a, b| b.cmp(a));
        new.dedup();
        if new.is_empty() {
            return Ok(());
        }
        let (local, at) = (&plan.local, &plan.at);
        let make_test = |n| StageBuffers::new(local, b, (at, &[n]), false);
        let reserve = match self.test {
            Some(_) => test_reserve(b, epoch, |n| plan.eval.contains_key(&n), make_test)?,
            None => 0,
        };
        let make = |n| StageBuffers::new(local, b, (at, &split.sizes(n)), true);
        let unit = split.smallest_batch(epoch.batch.min(epoch.samples));
        let made = training_buffers(b, (&new, epoch), (unit, reserve), make)?;
        plan.buffers.extend(new.into_iter().zip(made));
        Ok(())
    }

    fn train(
        &mut self,
        b: &B,
        _model: &M,
        (step, n): (usize, usize),
        pass: Pass<'_, B>,
    ) -> anyhow::Result<()> {
        let sizes = self.split.sizes(n);
        let stage = self.topology.stage();
        let (link, train) = (&mut self.link, &mut self.train);
        let plan = self
            .plan
            .as_mut()
            .context("the pipeline trains once its cut is settled")?;
        let Plan {
            at,
            local,
            part,
            buffers,
            scratch,
            ..
        } = plan;
        let scratch = match scratch {
            Some(scratch) => scratch,
            None => scratch.insert(GradScratch::new(b, part.len())?),
        };
        let bufs = (buffers.get_mut(&n))
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
        // A stage in the middle reads nothing of the data.
        if at.first || at.last {
            train.fill(b, step, bufs)?;
        }
        let (seeds, sum) = self.split.micro_batches(dropout_seed, &sizes, &mut *hook);
        let summed = matches!(sum, MicroSum::Weighted(_));
        Cx {
            b,
            model: local,
            at,
            stage,
            link: link.as_mut(),
            params,
            timer: &mut *timer,
            scratch: &mut *scratch,
            sums: (loss_sum, metric_sum),
            seeds,
            sum,
        }
        .train(bufs)?;
        if !summed {
            return Ok(());
        }
        // The stage's gradients were final when the schedule ended.
        timer.enter(Phase::Backward)?;
        b.write_range(&scratch.acc, grads, 0)?;
        hook.ready(b, grads, 0)
    }

    fn batch_rows(&self, _model: &M, _n: usize) -> Option<&[u32]> {
        None
    }

    fn evaluate(
        &mut self,
        b: &B,
        _model: &M,
        (params, orders): (&B::Storage<f32>, &[Order]),
        sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        let Some(test) = self.test.as_mut() else {
            return Ok(());
        };
        let stage = self.topology.stage();
        let link = &mut self.link;
        let plan = self
            .plan
            .as_mut()
            .context("the pipeline evaluates once its cut is settled")?;
        let (at, local) = (&plan.at, &plan.local);
        let context =
            |peer| format!("pipeline stage {stage}: evaluating, exchanging with stage {peer}");
        for order in orders {
            let sizes = test.start_epoch(b, order, 1, EVAL_BATCH)?;
            for (step, n) in sizes.into_iter().enumerate() {
                let bufs = match plan.eval.entry(n) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let make = |n| StageBuffers::new(local, b, (at, &[n]), false);
                        e.insert(test_buffers(n, make)?)
                    }
                };
                if at.first || at.last {
                    test.fill(b, step, bufs)?;
                }
                if !at.first {
                    let input = bufs.slots[0]
                        .input
                        .as_mut()
                        .context("a later stage receives")?;
                    link.exchange(b, stage - 1, None, Some(input))
                        .with_context(|| context(stage - 1))?;
                }
                forward_through(local, b, (at, bufs, 0), params, crate::model::Mode::Eval)?;
                let output = bufs.slots[0].cuts.last().context("a stage has a segment")?;
                if at.last {
                    let target = bufs.micro[0]
                        .targets
                        .as_ref()
                        .context("the last stage reads targets")?;
                    local.output_metric(b, n, (output, target), sum)?;
                } else {
                    link.exchange(b, stage + 1, Some(output), None)
                        .with_context(|| context(stage + 1))?;
                }
            }
        }
        Ok(())
    }
}

impl<B: Ops, M: Layered<B>> Pipeline<B, M> {
    /// The start-up line: the layout, and the cut with the times behind it.
    fn describe(&self, model: &M, runs: &[Range<usize>], times: &[f64]) -> String {
        let names = cuts::names(model);
        let stages: Vec<String> = (runs.iter().enumerate())
            .map(|(k, run)| {
                let ms: f64 = times[run.clone()].iter().sum::<f64>() * 1e3;
                format!("stage {k}: {} ({ms:.2} ms)", names[run.clone()].join(", "))
            })
            .collect();
        format!(
            "pipeline: {} stages x {} data-parallel replicas, {} (1F1B); cut at the measured times of a micro-batch's forward and backward: {}",
            self.topology.stages,
            self.topology.replicas(),
            self.split,
            stages.join("; ")
        )
    }
}

/// The parameters of segments `run`: consecutive ranges, joined.
fn segments_params<B: Ops, M: Layered<B>>(model: &M, run: &Range<usize>) -> Range<usize> {
    model.segment_params(run.start).start..model.segment_params(run.end - 1).end
}
