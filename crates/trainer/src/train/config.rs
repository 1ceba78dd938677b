//! What the training loop needs to know, shared by every rank.

use core_tensor::ops::AdamConfig;

use crate::checkpoint::Settings;
use crate::cli::SparseGrads;
use crate::data::DataFingerprint;
use crate::model::DropoutRates;

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
}

impl TrainConfig {
    /// What a checkpoint records of this configuration, training `model`
    /// (its `--model` name) on `data` (the training split's fingerprint)
    /// with `world_size` ranks in pipelines of `pipeline_stages`.
    pub fn settings(
        &self,
        (world_size, pipeline_stages): (usize, usize),
        model: &str,
        data: DataFingerprint,
    ) -> Settings {
        Settings {
            model: model.to_string(),
            data: Some(data),
            seed: self.seed,
            world_size,
            pipeline_stages,
            batch_size: self.batch_size,
            lr: self.adam.lr,
            dropout: self.dropout,
        }
    }
}
