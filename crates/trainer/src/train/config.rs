//! What the training loop needs to know, shared by every rank: its flags,
//! and the configuration they make.

use clap::Args;
use core_tensor::ops::AdamConfig;
use launcher::flags::positive_finite;

use super::exact::ExactRequest;
use crate::checkpoint::shared_record::SharedRecord;
use crate::checkpoint::{Settings, Summation};
use crate::data::DataFingerprint;
use crate::ddp::{CommHookChoice, DdpFlags, SparseGrads};
use crate::model::DropoutRates;

/// The loop's flags.
#[derive(Clone, Debug, Args)]
pub struct TrainFlags {
    /// Passes over the training set.
    #[arg(long, default_value_t = 5, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,

    /// Samples per step on each rank.
    #[arg(long, default_value_t = 64, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub batch_size: u32,

    /// Learning rate (Adam's; SGD's for --model toy).
    #[arg(long, default_value_t = 1e-3, value_name = "RATE", value_parser = positive_finite, allow_hyphen_values = true)]
    pub lr: f64,

    /// Seed for the initial weights, the shuffling and dropout.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,

    /// Stop each epoch after this many optimizer steps (for quick runs).
    ///
    /// [default: the whole epoch]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_steps: Option<u32>,

    /// Gradient accumulation: micro-batches per optimizer step.
    ///
    /// As PyTorch's no_sync(): K micro-batches of --batch-size per optimizer
    /// step, their gradients summed locally and averaged over the ranks once,
    /// after the K-th (an effective batch of K x --batch-size per rank).
    /// --max-steps and --checkpoint-every count optimizer steps; a pipeline
    /// accumulates its --micro-batches instead.
    #[arg(long, default_value_t = 1, value_name = "K", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub accumulate_steps: u32,

    /// Recsys: Adam on only the rows a step looked up, as SparseAdam.
    ///
    /// Only the embedding rows and per-row biases a step's batch looked up
    /// (all ranks' rows), as torch.optim.SparseAdam does, not the whole
    /// tables (dense Adam, the default, decays every row's moments every
    /// step). Needs the host's sparse exchange (--backend tcp, not
    /// --sparse-grads never) with more than one rank.
    #[arg(long)]
    pub sparse_adam: bool,

    /// The same bits at any layout (data parallel or pipeline, CPU or GPU).
    ///
    /// The final weights become a function of the seed, the data,
    /// --global-batch, the steps and the optimizer's settings alone, not of
    /// --world-size, --nnodes/--nproc-per-node, --threads, --spawn,
    /// --accumulate-steps, --pipeline-stages, the transport or which rank
    /// trains which sample. Each step's global batch is cut into units of
    /// --unit samples, each unit's gradient computed alone, and the units'
    /// gradients summed exactly (integers at a scale the ranks agree on).
    /// Data-parallel ranks or pipeline stages (a micro-batch a unit), on
    /// CPUs or on GPUs (CPU and GPU bits differ), --comm-hook none
    /// (README: "The same bits at any layout").
    #[arg(long)]
    pub reproducible: bool,

    /// With --reproducible: a step's samples over the whole job.
    ///
    /// A multiple of --unit [default: --batch-size x data-parallel replicas
    /// x --accumulate-steps].
    #[arg(long, value_name = "B", requires = "reproducible", value_parser = clap::value_parser!(u32).range(1..))]
    pub global_batch: Option<u32>,

    /// With --reproducible: samples per unit of work.
    ///
    /// Each unit's gradient is computed alone, the same wherever it runs.
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub unit: u32,
}

impl TrainFlags {
    /// The loop's configuration, averaging as `ddp` says, with `dropout`.
    pub fn config(&self, ddp: &DdpFlags, dropout: DropoutRates) -> TrainConfig {
        TrainConfig {
            epochs: self.epochs as usize,
            batch_size: self.batch_size as usize,
            adam: AdamConfig {
                lr: self.lr,
                ..AdamConfig::default()
            },
            seed: self.seed,
            max_steps: self.max_steps.map(|s| s as usize),
            dropout,
            bucket_mb: ddp.bucket_mb,
            sparse_grads: ddp.sparse_grads,
            sparse_adam: self.sparse_adam,
            accumulate_steps: self.accumulate_steps as usize,
            comm_hook: ddp.comm_hook,
            exact: self.reproducible.then_some(ExactRequest {
                global_batch: self.global_batch.map(|b| b as usize),
                unit: self.unit as usize,
            }),
        }
    }
}

/// What the loop needs to know, shared by every rank.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub epochs: usize,
    /// Samples per step on each rank.
    pub batch_size: usize,
    pub adam: AdamConfig,
    pub seed: u64,
    /// A cap on the steps of each epoch, for quick runs.
    pub max_steps: Option<usize>,
    pub dropout: DropoutRates,
    pub bucket_mb: f64,
    pub sparse_grads: SparseGrads,
    /// `--sparse-adam`: the lazy (SparseAdam) update of the model's row
    /// tables (`lazy_adam.rs`).
    pub sparse_adam: bool,
    /// Micro-batches of `batch_size` per optimizer step (`no_sync`).
    pub accumulate_steps: usize,
    /// How the dense gradient buckets travel (`--comm-hook`).
    pub comm_hook: CommHookChoice,
    /// `--reproducible`: units and their exact sum (`exact.rs`).
    pub exact: Option<ExactRequest>,
}

impl TrainConfig {
    /// The reference settings (Adam at 1e-3, seed 0, both dropouts, 25 MB
    /// buckets) for `epochs` of batches of `batch_size`.
    pub fn new(epochs: usize, batch_size: usize) -> Self {
        Self {
            epochs,
            batch_size,
            adam: AdamConfig::default(),
            seed: 0,
            max_steps: None,
            dropout: DropoutRates::REFERENCE,
            bucket_mb: 25.0,
            sparse_grads: SparseGrads::Auto,
            sparse_adam: false,
            accumulate_steps: 1,
            comm_hook: CommHookChoice::None,
            exact: None,
        }
    }

    /// What a checkpoint records of this configuration, training `model`
    /// (its `--model` name) on `data` (the training split's fingerprint)
    /// with `world_size` ranks in pipelines of `pipeline_stages`, the job's
    /// `shared` flags with it (if it has them: see `Checkpoints::record`).
    pub fn settings(
        &self,
        (world_size, pipeline_stages): (usize, usize),
        model: &str,
        data: DataFingerprint,
        shared: Option<SharedRecord>,
    ) -> Settings {
        Settings {
            shared,
            model: model.to_string(),
            data: Some(data),
            seed: self.seed,
            world_size,
            pipeline_stages,
            batch_size: self.batch_size,
            accumulate_steps: self.accumulate_steps,
            comm_hook: self.comm_hook.to_string(),
            lr: self.adam.lr,
            dropout: self.dropout,
            summation: match self.exact {
                None => Summation::Ring,
                Some(ExactRequest { global_batch, unit }) => {
                    let replicas = world_size / pipeline_stages.max(1);
                    let per_replica = self.batch_size * self.accumulate_steps;
                    Summation::Exact {
                        global_batch: global_batch.unwrap_or(per_replica * replicas),
                        unit,
                    }
                }
            },
        }
    }
}
