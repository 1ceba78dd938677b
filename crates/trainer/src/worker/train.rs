//! What a rank trains, by `--model`: the model and its data splits, rank
//! 0's choice of starting point, and the trainer that runs them.

use anyhow::Context;
use core_tensor::Ops;
use core_tensor::ops::AdamConfig;

use super::{Dataset, Job, drive};
use crate::checkpoint::origin::Origin;
use crate::checkpoint::resume::{self, Request};
use crate::checkpoint::{CheckpointDir, Checkpoints, Settings};
use crate::cli::Cli;
use crate::data::Batches;
use crate::ddp::{CommHook, CommThread};
use crate::model::cnn::DeviceSplit;
use crate::model::recsys::{RatingsShard, RecsysModel};
use crate::model::toy::{ToyData, ToyModel};
use crate::model::{CnnMnist, DropoutRates, Model};
use crate::monitor::Monitor;
use crate::pipeline::{PipelinePlace, PipelineStage, StageLink, describe_split};
use crate::stop::StopRequest;
use crate::train::{DataShare, RunOutcome, Setup, TrainConfig, Trainer};

/// A rank's links to the others and to the outside.
pub(super) struct Links<B: Ops> {
    pub comm: Option<CommThread>,
    /// A pipeline stage's data-parallel group (see [`Setup::group`]).
    pub group: Option<CommThread>,
    pub device_hook: Option<Box<dyn CommHook<B>>>,
    pub stop: StopRequest,
    pub monitor: Monitor,
    /// The samples this rank trains on, where not its own shard.
    pub share: Option<DataShare>,
}

/// A model's training and (if it has one) test split.
type Splits<B, M> = (
    Box<dyn Batches<B, <M as Model<B>>::Buffers>>,
    Option<Box<dyn Batches<B, <M as Model<B>>::Buffers>>>,
);

/// Trains `--model` as this rank: a pipeline stage where `pipeline` says.
pub(super) fn train_on<B: Ops>(
    backend: B,
    job: &Job<'_>,
    links: Links<B>,
    pipeline: Option<(PipelinePlace, Box<dyn StageLink<B>>)>,
) -> anyhow::Result<RunOutcome> {
    let cli = job.cli;
    let cfg = TrainConfig {
        epochs: cli.epochs as usize,
        batch_size: cli.batch_size as usize,
        adam: AdamConfig {
            lr: cli.lr,
            ..AdamConfig::default()
        },
        seed: cli.seed,
        max_steps: cli.max_steps.map(|s| s as usize),
        dropout: if cli.no_dropout {
            DropoutRates::OFF
        } else {
            DropoutRates::REFERENCE
        },
        bucket_mb: cli.bucket_mb,
        sparse_grads: cli.sparse_grads,
        sparse_adam: cli.sparse_adam,
    };
    let rank = job.info.rank;
    let context = || format!("rank {rank}: setting up");
    match job.data {
        Dataset::Fashion { train, test, .. } => {
            let upload = || -> anyhow::Result<(DeviceSplit<B>, DeviceSplit<B>)> {
                let train = DeviceSplit::upload(&backend, train, "training")?;
                let test = DeviceSplit::upload(&backend, test, "test")?;
                Ok((train, test))
            };
            let (train, test) = upload().with_context(context)?;
            let model = CnnMnist::new(cfg.dropout);
            match pipeline {
                None => {
                    let splits: Splits<B, CnnMnist> = (Box::new(train), Some(Box::new(test)));
                    train_model(backend, model, splits, cfg, job, links, |_| {})
                }
                Some((place, group)) => {
                    let micro = cli.micro_batches as usize;
                    let stage =
                        PipelineStage::new(model, place, micro, group).with_context(context)?;
                    if rank == 0 {
                        tell!(
                            "pipeline: {} stages x {} data-parallel replicas, {micro} micro-batches per batch (1F1B); {}",
                            place.stages,
                            place.replicas,
                            describe_split()
                        );
                    }
                    let links = Links {
                        share: Some(place.share()),
                        ..links
                    };
                    let splits: Splits<B, PipelineStage<B>> =
                        (Box::new(train), Some(Box::new(test)));
                    train_model(backend, stage, splits, cfg, job, links, |stage| {
                        let times = stage.times();
                        tell!(
                            "pipeline stage {} (rank {rank}): idle {:.1}% of {:.1} s in the schedule (waiting for the other stage)",
                            place.stage,
                            100.0 * times.idle_fraction(),
                            times.total.as_secs_f64()
                        );
                    })
                }
            }
        }
        Dataset::Toy { samples } => {
            let data = ToyData::generate(cfg.seed, *samples);
            let splits: Splits<B, ToyModel> = (Box::new(data), None);
            train_model(
                backend,
                ToyModel::default(),
                splits,
                cfg,
                job,
                links,
                |_| {},
            )
        }
        Dataset::Recsys { index, dim } => {
            let model = RecsysModel::new(index, *dim)?;
            let train = RatingsShard::new(index.clone(), false);
            let test: Box<dyn Batches<B, _>> = Box::new(RatingsShard::new(index.clone(), true));
            let splits: Splits<B, RecsysModel> = (Box::new(train), Some(test));
            train_model(backend, model, splits, cfg, job, links, |_| {})
        }
    }
}

/// Trains `model` on `splits` to the end; `finish` then sees the model,
/// for what it measured.
fn train_model<B: Ops, M: Model<B>>(
    backend: B,
    model: M,
    (train, test): Splits<B, M>,
    cfg: TrainConfig,
    job: &Job<'_>,
    links: Links<B>,
    finish: impl FnOnce(&M),
) -> anyhow::Result<RunOutcome> {
    let Job { cli, info, .. } = *job;
    let rank = info.rank;
    let device = backend.describe();
    let lead = rank == 0;
    let checkpoint_dir = cli
        .checkpoint_dir
        .as_ref()
        .map(|dir| CheckpointDir::new(dir, cli.keep as usize));
    // Rank 0 alone reads checkpoints (other hosts may not see them) and
    // sends what it found to the others.
    let origin = if lead {
        let layout = (info.world_size, cli.pipeline_stages as usize);
        let settings = cfg.settings(layout, model.kind(), train.fingerprint());
        choose_origin(cli, checkpoint_dir.as_ref(), &settings, model.layout())?
    } else {
        Origin::Fresh
    };
    let resumed = matches!(origin, Origin::Resume(_));
    let setup = Setup {
        comm: links.comm,
        origin,
        device_hook: links.device_hook,
        group: links.group,
        checkpoints: checkpoint_dir.map(|dir| Checkpoints {
            dir,
            every: cli.checkpoint_every,
        }),
        stop: links.stop,
        share: links.share,
        shared_flags: cli.shared_flags(),
    };
    let mut trainer = Trainer::with_model(backend, model, train, test, cfg, setup)
        .with_context(|| format!("rank {rank}: setting up"))?;
    let outcome = drive(&mut trainer, job, device, resumed, links.monitor);
    finish(trainer.model());
    outcome
}

/// Rank 0's decision of where training starts (see [`resume::choose`]),
/// after clearing what interrupted saves left in the checkpoint directory.
fn choose_origin(
    cli: &Cli,
    dir: Option<&CheckpointDir>,
    settings: &Settings,
    layout: &core_tensor::FlatLayout,
) -> anyhow::Result<Origin> {
    let choose = || -> anyhow::Result<Origin> {
        if let Some(dir) = dir {
            for leftover in dir.prepare()? {
                tell!(
                    "note: removed {}, left over from an interrupted save",
                    leftover.display()
                );
            }
        }
        let request = Request {
            resume: cli.resume.as_ref(),
            init_from: cli.init_from.as_deref(),
            dir,
        };
        resume::choose(&request, settings, layout)
    };
    choose().context("rank 0")
}
