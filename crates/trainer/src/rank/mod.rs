//! One rank's training, from its model and data to its last line: where
//! training starts (rank 0 reads the checkpoint directory,
//! `starting_point.rs`), the trainer, and rank 0's outputs around it
//! (`reported_run.rs`). A model's entry (`crate::models`) makes the network and
//! its data and hands them to [`Rank::train`]; everything else a rank
//! trains with was made before it (`crate::run`).

mod reported_run;
mod starting_point;

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use anyhow::{Context, anyhow, bail};
use core_tensor::Ops;

use crate::checkpoint::origin::Origin;
use crate::checkpoint::{CheckpointDir, CheckpointFlags, Checkpoints, TrainingState};
use crate::comm_thread::CommThread;
use crate::data::Batches;
use crate::ddp::AverageOver;
use crate::model::{Layered, Model};
use crate::monitor::Monitor;
use crate::pipeline::{Pipeline, StageBuffersOf, StageLink};
use crate::report::OutputFlags;
use crate::report::recovery::RecoveryEvent;
use crate::stop::StopRequest;
use crate::topology::Topology;
use crate::train::{
    EpochShare, JobLinks, Membership, Regroup, RunOutcome, Schedule, Setup, SharedSettings,
    TrainConfig, Trainer, WholeModel,
};

/// Everything a rank trains with, apart from its model and its data.
pub struct Rank<'a, B: Ops> {
    pub backend: B,
    pub topology: Topology,
    pub cfg: TrainConfig,
    pub links: Links<B>,
    pub stop: StopRequest,
    pub monitor: Monitor,
    pub job: &'a RankJob<'a>,
    /// A rank of a live job (`--recovery live`); `None`: any other.
    pub live: Option<Live>,
}

/// What a member of a live job keeps from one generation for the next.
pub struct Kept {
    pub state: Box<TrainingState>,
    pub share: EpochShare,
}

/// A rank of one generation of a live job: where the generation starts,
/// and where the rank's state goes when it ends (`crate::run`'s
/// generations).
pub struct Live {
    /// Rank 0's start: the most advanced member's state, kept in memory
    /// when the last generation ended; `None`: as the flags say (the job's
    /// first generation).
    pub start: Option<Box<TrainingState>>,
    /// What rank 0 asks between steps.
    pub membership: Box<dyn Membership>,
    /// `--min-world`: a generation of fewer ranks ends the job.
    pub min_world: usize,
    /// This rank's share of the epoch's numbers in the generation before.
    pub share: Option<EpochShare>,
    /// Where this rank's state at its last committed step, and its share
    /// of the epoch's numbers, go when the generation ends before its
    /// training does.
    pub kept: Rc<RefCell<Option<Kept>>>,
    /// After a recovery, what rank 0 reports once it healed the others
    /// (its seconds measured from the instant given, then).
    pub recovered: Option<(RecoveryEvent, Instant)>,
}

/// How a rank reaches the others (made by `crate::run`'s wiring), in each
/// of its legal shapes: a pipeline stage has neighbours only in a job of
/// several ranks.
pub enum Links<B: Ops> {
    /// The whole model: alone, or a replica among the job's ranks (see
    /// [`JobLinks`]).
    Whole(JobLinks<B>),
    /// A stage of a pipeline.
    Stage {
        /// The job's communicator (metrics, votes, the start, checkpoints).
        comm: CommThread,
        /// The way to its neighbouring stages.
        link: Box<dyn StageLink<B>>,
        /// Who averages its gradients with the same stage of the other
        /// pipelines'; `None` with one pipeline.
        averaging: Option<AverageOver<B>>,
    },
}

/// What every rank of a process is asked, beyond the loop's configuration.
pub struct RankJob<'a> {
    pub checkpoints: &'a CheckpointFlags,
    pub outputs: &'a OutputFlags,
    /// `--micro-batches`, if given.
    pub micro_batches: Option<usize>,
    /// The flags every rank must give alike.
    pub shared: SharedSettings,
    /// The start-up line after the device: the world, who started it, how
    /// gradients travel and what the data is.
    pub about: String,
    /// What PyTorch calls the model's module, for the last line.
    pub pytorch_class: &'static str,
}

/// A model's training and (if it has one) test split.
pub type Splits<B, M> = (
    Box<dyn Batches<B, <M as Model<B>>::Buffers>>,
    Option<Box<dyn Batches<B, <M as Model<B>>::Buffers>>>,
);

impl<B: Ops> Rank<'_, B> {
    /// Trains the whole `model` on `splits` to the end.
    pub fn train<M: Model<B> + 'static>(
        self,
        model: M,
        (train, test): Splits<B, M>,
    ) -> anyhow::Result<RunOutcome>
    where
        M::Buffers: 'static,
    {
        self.train_with(model, Box::new(WholeModel::new(train, test)))
    }

    /// Trains a model a pipeline can cut: this rank's stage of a pipeline
    /// when the job has several stages, else the whole model; `train` and
    /// `test` fill either's buffers.
    pub fn train_layered<M, D>(
        mut self,
        model: M,
        (train, test): (D, Option<D>),
    ) -> anyhow::Result<RunOutcome>
    where
        M: Layered<B> + 'static,
        M::Buffers: 'static,
        D: Batches<B, M::Buffers> + Batches<B, StageBuffersOf<B, M>> + 'static,
    {
        let link = match std::mem::replace(&mut self.links, Links::Whole(JobLinks::Alone)) {
            Links::Stage {
                comm,
                link,
                averaging,
            } => {
                // The pipeline's schedule holds the link from here on.
                self.links = Links::Whole(JobLinks::Job { comm, averaging });
                link
            }
            whole => {
                self.links = whole;
                let test = test.map(|t| Box::new(t) as Box<dyn Batches<B, M::Buffers>>);
                return self.train(model, (Box::new(train), test));
            }
        };
        let data = (
            Box::new(train) as Box<dyn Batches<B, StageBuffersOf<B, M>>>,
            test.map(|t| Box::new(t) as Box<_>),
        );
        let micro = self.job.micro_batches;
        let pipeline = Pipeline::new(&self.topology, micro, link, data)
            .with_context(|| format!("rank {}: setting up", self.topology.rank))?;
        self.train_with(model, Box::new(pipeline))
    }

    /// Trains `model` to the end as `schedule` runs it.
    fn train_with<M: Model<B>>(
        self,
        model: M,
        schedule: Box<dyn Schedule<B, M>>,
    ) -> anyhow::Result<RunOutcome> {
        let Rank {
            backend,
            topology,
            cfg,
            links,
            stop,
            monitor,
            job,
            mut live,
        } = self;
        let rank = topology.rank;
        let links = match links {
            Links::Whole(links) => links,
            Links::Stage { .. } => bail!(
                "rank {rank}: --model {} trains whole, not as a pipeline's stages: leave out --pipeline-stages",
                model.kind()
            ),
        };
        let flags = job.checkpoints;
        let dir =
            (flags.checkpoint_dir.as_ref()).map(|d| CheckpointDir::new(d, flags.keep as usize));
        // Rank 0 alone reads checkpoints (other hosts may not see them) and
        // sends what it found to the others; a live job's later generations
        // start from the state their rank 0 kept in memory.
        let kept = live.as_mut().and_then(|l| l.start.take());
        let origin = match (topology.leads(), kept) {
            (true, Some(kept)) => Origin::Resume(kept),
            (true, None) => {
                let layout = (topology.world, topology.stages);
                let (kind, data) = (model.kind(), schedule.fingerprint());
                let settings = cfg.settings(layout, kind, data, Some(job.shared.record()));
                starting_point::choose(flags, dir.as_ref(), &settings, model.layout())?
            }
            (false, _) => Origin::Fresh,
        };
        if let Some(live) = live.as_ref().filter(|l| topology.world < l.min_world) {
            return Err(below_min_world(
                (live.min_world, &topology),
                (&origin, dir.as_ref()),
                model.layout(),
            ));
        }
        let resumed = matches!(origin, Origin::Resume(_));
        let setup = Setup {
            topology,
            links,
            origin,
            checkpoints: dir.map(|dir| Checkpoints {
                dir,
                every: flags.checkpoint_every,
                record: Some(job.shared.record()),
            }),
            stop,
            shared: Some(job.shared.clone()),
        };
        let device = backend.describe();
        let mut trainer = Trainer::with_schedule(backend, model, schedule, cfg, setup)
            .with_context(|| format!("rank {rank}: setting up"))?;
        let how = (&topology, job);
        let Some(live) = live else {
            let report = (device, resumed, None);
            return reported_run::train_and_report(&mut trainer, how, report, monitor);
        };
        // Every rank is healed once its trainer is set up.
        let recovered = live.recovered.map(|(event, since)| RecoveryEvent {
            seconds: since.elapsed().as_secs_f64(),
            heal_bytes: trainer.start_bytes(),
            ..event
        });
        if topology.leads() {
            trainer.watch_membership(live.membership);
        }
        if let Some(share) = live.share {
            trainer.carry(share);
        }
        let report = (device, resumed, recovered);
        let ran = reported_run::train_and_report(&mut trainer, how, report, monitor);
        // The generation ends: on a lost peer, after the step this rank
        // committed last; to let newcomers in, after the step all agreed on.
        let (at, why) = match ran {
            Ok(RunOutcome::Regroup { at, why }) => (at, why),
            Err(e) => match Regroup::after(&e) {
                Some(why) => (trainer.committed(), why),
                None => return Err(e),
            },
            ended => return ended,
        };
        let state = Box::new(trainer.kept_state()?);
        let share = trainer.epoch_share()?;
        *live.kept.borrow_mut() = Some(Kept { state, share });
        Ok(RunOutcome::Regroup { at, why })
    }
}

/// The error of a live job's generation of fewer ranks than `min_world`;
/// its rank 0 first saves the state it starts from (`origin`, the last
/// committed step) into `dir`, if the job has one.
fn below_min_world(
    (min_world, topology): (usize, &Topology),
    (origin, dir): (&Origin, Option<&CheckpointDir>),
    layout: &core_tensor::FlatLayout,
) -> anyhow::Error {
    let (rank, world) = (topology.rank, topology.world);
    let saved = match (origin, dir) {
        (Origin::Resume(state), Some(dir)) => match dir.save(state, layout) {
            Ok(path) => format!(
                "; the last committed step is saved in {}: resume with --resume auto",
                path.display()
            ),
            Err(e) => format!("; saving the last committed step failed: {e:#}"),
        },
        _ => String::new(),
    };
    anyhow!(
        "rank {rank}: the job is down to {world} rank(s), fewer than --min-world {min_world} (ranks lost, and their replacements not joined or none left: --max-restarts){saved}"
    )
}
