//! One rank's training, from its model and data to its last line: where
//! training starts (rank 0 reads the checkpoint directory,
//! `origin.rs`), the trainer, and rank 0's outputs around it
//! (`drive.rs`). A model's entry (`crate::models`) makes the network and
//! its data and hands them to [`Rank::train`]; everything else a rank
//! trains with was made before it (`crate::run`).

mod drive;
mod origin;

use anyhow::Context;
use core_tensor::Ops;

use crate::checkpoint::{CheckpointDir, CheckpointFlags, Checkpoints};
use crate::comm_thread::CommThread;
use crate::data::Batches;
use crate::ddp::CommHook;
use crate::model::Model;
use crate::monitor::Monitor;
use crate::pipeline::StageLink;
use crate::report::OutputFlags;
use crate::stop::StopRequest;
use crate::topology::Topology;
use crate::train::{DataShare, RunOutcome, Setup, TrainConfig, Trainer};

/// Everything a rank trains with, apart from its model and its data.
pub struct Rank<'a, B: Ops> {
    pub backend: B,
    pub topology: Topology,
    pub cfg: TrainConfig,
    pub links: Links<B>,
    pub stop: StopRequest,
    pub monitor: Monitor,
    pub job: &'a RankJob<'a>,
}

/// How a rank reaches the others (made by `crate::run`'s wiring).
pub struct Links<B: Ops> {
    /// The job's communicator; `None` for one rank.
    pub comm: Option<CommThread>,
    /// A pipeline stage's data-parallel group (see [`Setup::group`]).
    pub group: Option<CommThread>,
    /// Averages gradients on the device (NCCL).
    pub device_hook: Option<Box<dyn CommHook<B>>>,
    /// A pipeline stage's way to its neighbours.
    pub pipeline: Option<Box<dyn StageLink<B>>>,
}

/// What every rank of a process is asked, beyond the loop's configuration.
pub struct RankJob<'a> {
    pub checkpoints: &'a CheckpointFlags,
    pub outputs: &'a OutputFlags,
    pub micro_batches: usize,
    /// The flags every rank must give alike, as `(flag, value)`.
    pub shared_flags: Vec<(&'static str, String)>,
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
    /// Trains `model` on `splits` to the end.
    pub fn train<M: Model<B>>(self, model: M, splits: Splits<B, M>) -> anyhow::Result<RunOutcome> {
        self.train_then(model, splits, |_| {})
    }

    /// Trains `model` on `splits` to the end; `finish` then sees the
    /// model, for what it measured.
    pub fn train_then<M: Model<B>>(
        self,
        model: M,
        (train, test): Splits<B, M>,
        finish: impl FnOnce(&M),
    ) -> anyhow::Result<RunOutcome> {
        let Rank {
            backend,
            topology,
            cfg,
            links,
            stop,
            monitor,
            job,
        } = self;
        let rank = topology.rank;
        let flags = job.checkpoints;
        let dir =
            (flags.checkpoint_dir.as_ref()).map(|d| CheckpointDir::new(d, flags.keep as usize));
        // Rank 0 alone reads checkpoints (other hosts may not see them) and
        // sends what it found to the others.
        let origin = match topology.leads() {
            true => {
                let layout = (topology.world, topology.stages);
                let settings = cfg.settings(layout, model.kind(), train.fingerprint());
                origin::choose(flags, dir.as_ref(), &settings, model.layout())?
            }
            false => crate::checkpoint::origin::Origin::Fresh,
        };
        let resumed = matches!(origin, crate::checkpoint::origin::Origin::Resume(_));
        let setup = Setup {
            comm: links.comm,
            origin,
            device_hook: links.device_hook,
            group: links.group,
            checkpoints: dir.map(|dir| Checkpoints {
                dir,
                every: flags.checkpoint_every,
            }),
            stop,
            share: Some(DataShare {
                replica: topology.replica(),
                replicas: topology.replicas(),
                counts: topology.counts_samples(),
            }),
            shared_flags: job.shared_flags.clone(),
        };
        let device = backend.describe();
        let mut trainer = Trainer::with_model(backend, model, train, test, cfg, setup)
            .with_context(|| format!("rank {rank}: setting up"))?;
        let outcome = drive::drive(&mut trainer, (&topology, job), device, resumed, monitor);
        finish(trainer.model());
        outcome
    }
}
