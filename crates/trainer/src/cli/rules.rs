//! The rules between flags that clap does not express in one line.

use anyhow::bail;
use core_tensor::Fp32Tile;

use super::{BackendChoice, Cli, DeviceChoice, ModelChoice, ResumeFrom, SparseGrads};

impl Cli {
    /// The rules between flags that clap does not express in one line.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.model != ModelChoice::Toy && self.samples.is_some() {
            bail!(
                "--samples sizes the synthetic data of --model toy; other models read a data set"
            );
        }
        let recsys = self.model == ModelChoice::Recsys;
        if recsys != self.ratings.is_some() {
            bail!(
                "--model recsys trains on --ratings PATH (a MovieLens ratings.csv); give both or neither"
            );
        }
        if !recsys && self.embedding_dim.is_some() {
            bail!("--embedding-dim is for --model recsys");
        }
        if self.model != ModelChoice::Cnn && (self.data_dir.is_some() || self.no_dropout) {
            bail!("--data-dir and --no-dropout are for --model cnn (the FashionMNIST CNN)");
        }
        if self.model != ModelChoice::Recsys && self.sparse_grads != SparseGrads::Auto {
            bail!(
                "--sparse-grads chooses how recsys' embedding rows travel; it is for --model recsys"
            );
        }
        if self.sparse_adam && !recsys {
            bail!(
                "--sparse-adam updates the embedding rows a batch looked up; it is for --model recsys (other models have no such table)"
            );
        }
        if self.sparse_adam
            && (self.backend == BackendChoice::Nccl || self.sparse_grads == SparseGrads::Never)
        {
            bail!(
                "--sparse-adam takes the rows to update from the host's sparse gradient exchange, which --backend nccl and --sparse-grads never turn off; use --backend tcp and --sparse-grads auto, or leave --sparse-adam out"
            );
        }
        if self.pipeline_stages > 2 {
            bail!(
                "--pipeline-stages {}: this CNN splits into 2 stages (the convolution stack and the fully connected stack); use 2",
                self.pipeline_stages
            );
        }
        if self.model != ModelChoice::Cnn && self.pipeline_stages > 1 {
            bail!(
                "--pipeline-stages splits --model cnn into stages; --model toy and recsys train whole on every rank (leave it out)"
            );
        }
        if self.pipeline_stages > 1 && self.micro_batches > self.batch_size {
            bail!(
                "--micro-batches {} is more than --batch-size {}: each micro-batch needs at least one sample",
                self.micro_batches,
                self.batch_size
            );
        }
        let has_dir = self.checkpoint_dir.is_some();
        if self.checkpoint_every.is_some() && !has_dir {
            bail!("--checkpoint-every needs --checkpoint-dir");
        }
        if self.device == DeviceChoice::Cpu && self.tf32 {
            bail!("--tf32 runs products on a GPU's tensor cores; --device cpu has none");
        }
        if self.fp32_tile == Fp32Tile::Wide && (self.tf32 || self.device == DeviceChoice::Cpu) {
            bail!(
                "--fp32-tile wide is the tile of a GPU's float32 products; --tf32 and --device cpu have none (leave it out)"
            );
        }
        if self.device == DeviceChoice::Cpu && self.backend == BackendChoice::Nccl {
            bail!(
                "--backend nccl moves gradients between GPUs; with --device cpu use --backend tcp (or auto)"
            );
        }
        if self.launch.max_restarts > 0 && !has_dir {
            bail!(
                "--max-restarts needs --checkpoint-dir: restarts continue from the newest checkpoint there"
            );
        }
        match &self.resume {
            Some(ResumeFrom::Auto) if !has_dir => bail!("--resume auto needs --checkpoint-dir"),
            Some(ResumeFrom::Path(_)) if self.init_from.is_some() => {
                bail!(
                    "--resume PATH and --init-from both say where to start: give one (--init-from goes with --resume auto)"
                )
            }
            _ => Ok(()),
        }
    }
}
