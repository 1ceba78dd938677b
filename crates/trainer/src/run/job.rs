//! Every flag a rank reads, in the groups of the modules that read them.

use clap::Args;

use super::device::DeviceFlags;
use super::flight_recorder::FlightFlags;
use super::help_heading;
use super::join::JoinFlags;
use crate::checkpoint::CheckpointFlags;
use crate::ddp::DdpFlags;
use crate::models::ModelFlags;
use crate::pipeline::PipelineFlags;
use crate::report::OutputFlags;
use crate::train::{TrainConfig, TrainFlags};

/// A rank's flags.
#[derive(Clone, Debug, Args)]
pub struct JobFlags {
    #[command(flatten, next_help_heading = help_heading::MODEL)]
    pub model: ModelFlags,

    #[command(flatten, next_help_heading = help_heading::TRAINING)]
    pub train: TrainFlags,

    #[command(flatten, next_help_heading = help_heading::DEVICES)]
    pub device: DeviceFlags,

    #[command(flatten, next_help_heading = help_heading::COMMUNICATION)]
    pub ddp: DdpFlags,

    #[command(flatten, next_help_heading = help_heading::TRAINING)]
    pub pipeline: PipelineFlags,

    #[command(flatten, next_help_heading = help_heading::CHECKPOINTS)]
    pub checkpoints: CheckpointFlags,

    #[command(flatten, next_help_heading = help_heading::OBSERVABILITY)]
    pub outputs: OutputFlags,

    #[command(flatten, next_help_heading = help_heading::LAUNCHING)]
    pub join: JoinFlags,

    #[command(flatten, next_help_heading = help_heading::OBSERVABILITY)]
    pub flight: FlightFlags,
}

impl JobFlags {
    /// The flags whose values every rank must share, as `(flag, value)`:
    /// with another `--lr` or `--no-dropout` a rank would train another
    /// model without a word, with other `--epochs`, `--max-steps` or
    /// `--checkpoint-every` it would call collectives the others never
    /// call. Per-rank choices (`--device`, `--threads`, paths, rank 0's
    /// outputs) are not among them.
    pub fn shared_flags(&self) -> Vec<(&'static str, String)> {
        let given = |on: bool| if on { "given" } else { "not given" }.to_string();
        let or_none = |v: Option<String>| v.unwrap_or_else(|| "(not given)".into());
        let (model, train, ddp) = (&self.model, &self.train, &self.ddp);
        let checkpoints = &self.checkpoints;
        vec![
            ("--model", model.model.entry().name().to_string()),
            ("--epochs", train.epochs.to_string()),
            ("--batch-size", train.batch_size.to_string()),
            ("--lr", train.lr.to_string()),
            ("--seed", train.seed.to_string()),
            (
                "--max-steps",
                or_none(train.max_steps.map(|n| n.to_string())),
            ),
            ("--no-dropout", given(model.cnn.no_dropout)),
            (
                "--eval-samples",
                or_none(model.cnn.eval_samples.map(|n| n.to_string())),
            ),
            (
                "--samples",
                or_none(model.toy.samples.map(|n| n.to_string())),
            ),
            (
                "--embedding-dim",
                or_none(model.recsys.embedding_dim.map(|n| n.to_string())),
            ),
            ("--accumulate-steps", train.accumulate_steps.to_string()),
            ("--reproducible", given(train.reproducible)),
            (
                "--global-batch",
                or_none(train.global_batch.map(|n| n.to_string())),
            ),
            ("--unit", train.unit.to_string()),
            ("--bucket-mb", ddp.bucket_mb.to_string()),
            ("--comm-hook", ddp.comm_hook.to_string()),
            (
                "--sparse-grads",
                format!("{:?}", ddp.sparse_grads).to_lowercase(),
            ),
            ("--sparse-adam", given(train.sparse_adam)),
            ("--backend", format!("{:?}", ddp.backend).to_lowercase()),
            (
                "--precision",
                self.device
                    .precision()
                    .map_or_else(|refused| refused, |(p, _)| p.to_string()),
            ),
            // Given or not (its path is rank 0's alone): every rank takes
            // part in each save.
            (
                "--checkpoint-dir",
                given(checkpoints.checkpoint_dir.is_some()),
            ),
            (
                "--checkpoint-every",
                or_none(checkpoints.checkpoint_every.map(|n| n.to_string())),
            ),
            (
                "--pipeline-stages",
                self.pipeline.pipeline_stages.to_string(),
            ),
            ("--micro-batches", self.pipeline.micro_batches.to_string()),
        ]
    }

    /// Where this machine's ranks write their flight records; `job` names
    /// the job among others on the machine when no directory is given.
    pub fn flight_dir(&self, job: impl std::fmt::Display) -> std::path::PathBuf {
        let checkpoints = self.checkpoints.checkpoint_dir.as_deref();
        self.flight.dir(checkpoints, job)
    }

    /// The training loop's configuration.
    pub fn train_config(&self) -> TrainConfig {
        let dropout = self.model.model.entry().dropout(&self.model);
        self.train.config(&self.ddp, dropout)
    }
}
