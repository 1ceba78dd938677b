//! Every flag a rank reads, in the groups of the modules that read them.

use clap::Args;
use core_tensor::MatmulPrecision;

use super::device::DeviceFlags;
use super::flight_recorder::FlightFlags;
use super::help_heading;
use super::join::JoinFlags;
use crate::checkpoint::CheckpointFlags;
use crate::ddp::DdpFlags;
use crate::models::ModelFlags;
use crate::pipeline::PipelineFlags;
use crate::report::OutputFlags;
use crate::train::{
    GradientSettings, LayoutSettings, ModelSettings, ScheduleSettings, SharedSettings, TrainConfig,
    TrainFlags,
};

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
    /// The flags whose values every rank must share (see
    /// [`SharedSettings`]); `precision` as the device flags give it.
    pub fn shared_settings(&self, precision: MatmulPrecision) -> SharedSettings {
        let (model, train, ddp) = (&self.model, &self.train, &self.ddp);
        SharedSettings {
            model: ModelSettings {
                model: model.model.entry().name().to_string(),
                no_dropout: model.cnn.no_dropout,
                eval_samples: model.cnn.eval_samples.map(|n| n.get()),
                samples: model.toy.samples,
                embedding_dim: model.recsys.embedding_dim,
            },
            schedule: ScheduleSettings {
                epochs: train.epochs,
                batch_size: train.batch_size,
                lr: train.lr,
                seed: train.seed,
                max_steps: train.max_steps,
                accumulate_steps: train.accumulate_steps,
                reproducible: train.reproducible,
                global_batch: train.global_batch,
                unit: train.unit,
                sparse_adam: train.sparse_adam,
            },
            gradients: GradientSettings {
                bucket_mb: ddp.bucket_mb,
                comm_hook: ddp.comm_hook,
                sparse_grads: ddp.sparse_grads,
                backend: ddp.backend,
                precision,
            },
            layout: LayoutSettings {
                checkpoint_dir: self.checkpoints.checkpoint_dir.is_some(),
                checkpoint_every: self.checkpoints.checkpoint_every,
                pipeline_stages: self.pipeline.pipeline_stages,
                micro_batches: self.pipeline.micro_batches,
            },
        }
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
