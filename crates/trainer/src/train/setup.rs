//! How a replica comes to be: what it is given beyond the backend, the
//! model, its schedule and the configuration, and the one path every
//! start takes (the ranks' agreement, the starting point, the plans of the
//! averaging and the optimizer).

use anyhow::{Context, bail};
use core_tensor::Ops;

use super::accumulate::Accumulator;
use super::agreement;
use super::engine::StepEngine;
use super::exact::{self, ExactSum, UnitPlan};
use super::meter::{EpochMeter, ResumePoint};
use super::optimizer;
use super::replica::Replica;
use super::shared_settings::SharedSettings;
use super::votes::StopVotes;
use super::{LoopState, Schedule, TrainConfig, Trainer};
use crate::checkpoint::Checkpoints;
use crate::checkpoint::origin::{self, Origin};
use crate::comm_thread::CommThread;
use crate::ddp::averaging::Plan;
use crate::ddp::powersgd::PowerSgdState;
use crate::ddp::{AverageOver, Averaging};
use crate::model::Model;
use crate::monitor::Monitor;
use crate::phases::StepTimer;
use crate::stop::StopRequest;
use crate::topology::Topology;

/// What a replica is given beyond the backend, model, schedule and
/// configuration.
pub struct Setup<B: Ops> {
    /// Where this rank sits in the job.
    pub topology: Topology,
    /// How it reaches the job's other ranks.
    pub links: JobLinks<B>,
    /// Rank 0's starting point (ignored on other ranks, which receive it).
    pub origin: Origin,
    /// Checkpoints (on every rank: mid-epoch ones are collective).
    pub checkpoints: Option<Checkpoints>,
    /// Checked once per step.
    pub stop: StopRequest,
    /// The flags every rank must give alike, checked against rank 0's
    /// before anything else travels: the one check that ranks agree on the
    /// seed, batch size and the rest (each checkpoint records them:
    /// [`Checkpoints::record`]). `None` (as [`Setup::fresh`] leaves it),
    /// nothing is checked: for ranks built in one program from one
    /// [`TrainConfig`].
    pub shared: Option<SharedSettings>,
}

/// How a replica reaches the job's other ranks: alone, or over the job's
/// communicator, with or without others to average its gradients with
/// (never an averaging without a communicator).
#[expect(
    clippy::large_enum_variant,
    reason = "one per rank, made once and moved into its trainer: boxing would buy nothing"
)]
pub enum JobLinks<B: Ops> {
    /// A job of one rank: nobody to reach.
    Alone,
    /// A rank among several.
    Job {
        /// The job's communicator (metrics, stop votes, the starting
        /// state, checkpoints).
        comm: CommThread,
        /// Who averages the gradients with the other replicas'; `None`
        /// with one replica (nothing to average: a pipeline of one, a live
        /// job's last member).
        averaging: Option<AverageOver<B>>,
    },
}

impl<B: Ops> JobLinks<B> {
    /// The communicator and the averaging, as the trainer keeps them.
    fn split(self) -> (Option<CommThread>, Option<AverageOver<B>>) {
        match self {
            Self::Alone => (None, None),
            Self::Job { comm, averaging } => (Some(comm), averaging),
        }
    }
}

impl<B: Ops> Setup<B> {
    /// A fresh start of a data-parallel rank over `comm` (its rank and
    /// world size), averaging through it.
    pub fn fresh(comm: Option<CommThread>) -> Self {
        let links = match comm {
            None => JobLinks::Alone,
            Some(comm) => {
                let averaging = (comm.world_size() > 1).then_some(AverageOver::Job);
                JobLinks::Job { comm, averaging }
            }
        };
        Self::linked(links)
    }

    /// A fresh start of a rank linked by `links`, at the rank and world size
    /// of its communicator (a data-parallel rank's topology: a pipeline's
    /// caller sets its own).
    pub fn linked(links: JobLinks<B>) -> Self {
        let (rank, world) = match &links {
            JobLinks::Alone => (0, 1),
            JobLinks::Job { comm, .. } => (comm.rank(), comm.world_size()),
        };
        Self {
            topology: Topology {
                rank,
                world,
                local_rank: rank,
                local_world: world,
                stages: 1,
            },
            links,
            origin: Origin::Fresh,
            checkpoints: None,
            stop: StopRequest::new(),
            shared: None,
        }
    }
}

impl<B: Ops, M: Model<B>> Trainer<B, M> {
    /// A replica of `model` that `schedule` runs over its batches, as
    /// `setup` says.
    pub fn with_schedule(
        backend: B,
        model: M,
        mut schedule: Box<dyn Schedule<B, M>>,
        cfg: TrainConfig,
        setup: Setup<B>,
    ) -> anyhow::Result<Self> {
        if cfg.batch_size == 0 || cfg.epochs == 0 {
            bail!("the batch size and the number of epochs must be at least 1");
        }
        cfg.adam.validate()?;
        if cfg.accumulate_steps == 0 {
            bail!("--accumulate-steps must be at least 1");
        }
        let Setup {
            topology,
            links,
            origin,
            checkpoints,
            stop,
            shared,
        } = setup;
        let (mut comm, averaging) = links.split();
        let rank = topology.rank;
        if averaging.is_some() != (topology.replicas() > 1) {
            bail!(
                "rank {rank}: {} replica(s) of its parameters need {} to average their gradients",
                topology.replicas(),
                if averaging.is_some() {
                    "nothing"
                } else {
                    "a communicator"
                }
            );
        }
        if let (Some(comm), Some(shared)) = (comm.as_mut(), shared.as_ref()) {
            // Each rank reads its own copy of the data (another host's may
            // differ): the replicas must train on the same samples.
            agreement::check(comm, shared, schedule.fingerprint())
                .with_context(|| format!("rank {rank}: checking the flags against rank 0's"))?;
        }
        // --reproducible: the units of every step, and how the schedule
        // takes this replica's (a pass each, or a pipeline's micro-batches).
        let units = match cfg.exact {
            None => None,
            Some(request) => {
                let rows = model.row_tables().map(|_| model.kind());
                let hook = cfg.comm_hook.to_string();
                exact::refuse_unsupported(&hook, rows)?;
                let per_replica = cfg.batch_size * cfg.accumulate_steps;
                let at = (topology.replica(), topology.replicas());
                let plan = UnitPlan::new(request, per_replica, at)?;
                let per_batch = schedule.train_units((plan.unit, plan.share.len()))?;
                Some((plan, per_batch))
            }
        };
        schedule
            .settle(&backend, (&model, cfg.batch_size), comm.as_mut())
            .with_context(|| format!("rank {rank}: planning the schedule"))?;
        let layout = model.layout();
        let start = origin::agree(
            origin,
            comm.as_mut(),
            || model.init_params(cfg.seed),
            layout.len(),
        )
        .with_context(|| format!("rank {rank}: agreeing on the starting point"))?;
        // The host waits for every step unless a GPU averages on itself.
        let host_steps = B::IN_HOST_MEMORY || !matches!(averaging, Some(AverageOver::Device(_)));
        let part = schedule.part().map(|p| p.range());
        let trained = part.clone().unwrap_or(0..layout.len());
        if cfg.accumulate_steps > 1 && part.is_some() {
            bail!(
                "--accumulate-steps {} with --pipeline-stages: a pipeline already sums its micro-batches' gradients before averaging; use --batch-size {} --micro-batches {} x M instead",
                cfg.accumulate_steps,
                cfg.accumulate_steps * cfg.batch_size,
                cfg.accumulate_steps
            );
        }
        if cfg.accumulate_steps > 1 && model.row_tables().is_some() {
            bail!(
                "--accumulate-steps: --model {}'s row tables are averaged by the rows of one batch; it trains without accumulation",
                model.kind()
            );
        }
        let exact =
            units.map(|(plan, per_batch)| ExactSum::new(layout, trained.clone(), plan, per_batch));
        // A unit of --reproducible is a step's micro-batch of its own.
        let accumulator = (cfg.accumulate_steps > 1 && exact.is_none())
            .then(|| Accumulator::new(&backend, trained.len()))
            .transpose()?;
        let plan = Plan {
            bucket_mb: cfg.bucket_mb,
            sparse_grads: cfg.sparse_grads,
            row_union: cfg.sparse_adam,
            comm_hook: cfg.comm_hook,
            seed: cfg.seed,
        };
        let mut averaging =
            Averaging::plan(&backend, (&model, trained), &plan, averaging, comm.as_ref())
                .with_context(|| format!("rank {rank}: planning the gradient averaging"))?;
        if let Some(hook) = &start.hook {
            let state = PowerSgdState {
                q: hook.q.clone(),
                error: hook.error.clone(),
            };
            (averaging.restore_powersgd(&state))
                .with_context(|| format!("rank {rank}: continuing PowerSGD from the checkpoint"))?;
        }
        let optimizer = optimizer::choose(&model, &cfg, &averaging, topology.replicas())
            .with_context(|| format!("rank {rank}: planning the optimizer"))?;
        let state = LoopState {
            meter: EpochMeter::new(&backend)?,
            timer: StepTimer::new(backend.clone()),
            votes: StopVotes::new(comm.as_ref(), host_steps),
            stop,
            checkpoints,
            monitor: Monitor::off(),
            first_epoch: start.position.epoch as usize,
            resume_at: (start.position.step > 0).then(|| ResumePoint::of(&start)),
            last_saved: None,
            ledger: None,
            committed: start.position,
            live: super::live::LiveState {
                start_bytes: start.broadcast_bytes,
                ..Default::default()
            },
        };
        let replica = Replica::upload(&backend, &start, part)?;
        let engine = StepEngine::new(
            (backend, model, schedule),
            (replica, optimizer),
            (averaging, comm),
            (accumulator, exact),
        );
        Ok(Self {
            engine,
            cfg,
            topology,
            state,
        })
    }
}
