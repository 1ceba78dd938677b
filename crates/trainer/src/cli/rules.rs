//! The rules between flags that clap does not express in one line.

use anyhow::bail;
use core_tensor::{Fp32Tile, GemmStaging, MatmulPrecision, RefusedProducts};

use super::{Cli, Spawn};
use crate::checkpoint::resume::ResumeFrom;
use crate::ddp::{BackendChoice, CommHookChoice, SparseGrads};
use crate::run::{DeviceChoice, Recovery};

impl Cli {
    /// The rules between flags that clap does not express in one line.
    pub fn validate(&self) -> anyhow::Result<()> {
        let job = &self.job;
        let (train, ddp, device, pipeline) = (&job.train, &job.ddp, &job.device, &job.pipeline);
        job.model.check(&self.capabilities_given())?;
        let entry = job.model.model.entry();
        let stages = pipeline.pipeline_stages as usize;
        if stages > entry.max_stages() {
            bail!(
                "--pipeline-stages {stages}: --model {} splits into at most {} stages",
                entry.name(),
                entry.max_stages()
            );
        }
        if train.sparse_adam
            && (ddp.backend == BackendChoice::Nccl || ddp.sparse_grads == SparseGrads::Never)
        {
            bail!(
                "--sparse-adam takes the rows to update from the host's sparse gradient exchange, which --backend nccl and --sparse-grads never turn off; use --backend tcp and --sparse-grads auto, or leave --sparse-adam out"
            );
        }
        if stages > 1 && pipeline.micro_batch_count() > train.batch_size as usize {
            bail!(
                "--micro-batches {} is more than --batch-size {}: each micro-batch needs at least one sample",
                pipeline.micro_batch_count(),
                train.batch_size
            );
        }
        if stages > 1 && train.accumulate_steps > 1 {
            bail!(
                "--accumulate-steps {k} with --pipeline-stages {stages}: a pipeline already sums its --micro-batches' gradients before averaging; use --batch-size {} --micro-batches {} instead",
                train.batch_size * train.accumulate_steps,
                pipeline.micro_batch_count() * train.accumulate_steps as usize,
                k = train.accumulate_steps
            );
        }
        if let CommHookChoice::PowerSgd { .. } = ddp.comm_hook {
            if ddp.backend == BackendChoice::Nccl {
                bail!(
                    "--comm-hook {} runs on the host's ring, and NCCL carries bf16 and fp16 only: use --backend tcp (or a bf16/fp16 hook with NCCL)",
                    ddp.comm_hook
                );
            }
            if stages > 1 {
                bail!(
                    "--comm-hook {} keeps per-rank state that checkpoints hold for data-parallel ranks only: leave out --pipeline-stages, or use --comm-hook bf16/fp16",
                    ddp.comm_hook
                );
            }
        }
        let checkpoints = &job.checkpoints;
        let has_dir = checkpoints.checkpoint_dir.is_some();
        if checkpoints.checkpoint_every.is_some() && !has_dir {
            bail!("--checkpoint-every needs --checkpoint-dir");
        }
        let (precision, named) = device.precision().map_err(anyhow::Error::msg)?;
        let cpu = device.device == DeviceChoice::Cpu;
        let flag = named.unwrap_or_default();
        if cpu && precision != MatmulPrecision::Fp32 {
            let why = match precision {
                MatmulPrecision::Bf16 => " (the CPU trains in float32: docs/gpu.md says why)",
                _ => "",
            };
            bail!("{flag} runs products on a GPU's tensor cores; --device cpu has none{why}");
        }
        if cpu && device.fp32_tile == Fp32Tile::Wide {
            bail!(RefusedProducts::WideTile);
        }
        if cpu && device.gemm_staging == GemmStaging::CpAsync {
            bail!(RefusedProducts::CpAsyncStaging);
        }
        device.products()?;
        if device.device == DeviceChoice::Cpu && device.no_fusion {
            bail!(
                "--no-fusion chooses a GPU's unfused kernels; --device cpu has no fused ones (leave it out)"
            );
        }
        if device.device == DeviceChoice::Cpu && ddp.backend == BackendChoice::Nccl {
            bail!(
                "--backend nccl moves gradients between GPUs; with --device cpu use --backend tcp (or auto)"
            );
        }
        if job.join.recovery == Recovery::Live {
            self.live_rules()?;
        } else if job.join.min_world > 1 {
            bail!(
                "--min-world {} is the fewest ranks a live job goes on with: add --recovery live",
                job.join.min_world
            );
        }
        if self.launch.max_restarts > 0 && !has_dir {
            bail!(
                "--max-restarts needs --checkpoint-dir: restarts continue from the newest checkpoint there"
            );
        }
        match &checkpoints.resume {
            Some(ResumeFrom::Auto) if !has_dir => bail!("--resume auto needs --checkpoint-dir"),
            Some(ResumeFrom::Path(_)) if checkpoints.init_from.is_some() => {
                bail!(
                    "--resume PATH and --init-from both say where to start: give one (--init-from goes with --resume auto)"
                )
            }
            _ => Ok(()),
        }
    }

    /// What `--recovery live` needs: a global batch that does not depend on
    /// the ranks left, and ranks that can be lost alone.
    fn live_rules(&self) -> anyhow::Result<()> {
        let job = &self.job;
        if job.train.global_batch.is_none() {
            bail!(
                "--recovery live needs --reproducible --global-batch B: the ranks left share the same global batch, so that the model does not depend on how many train it"
            );
        }
        if job.pipeline.pipeline_stages > 1 {
            bail!(
                "--recovery live with --pipeline-stages: a stage holds a part of the model that no rank outside its pipeline has, so a lost stage cannot be healed from the others; use --recovery restart"
            );
        }
        if self.spawn == Spawn::Threads {
            bail!(
                "--recovery live with --spawn threads: ranks that are threads of one process are lost together; use --spawn processes"
            );
        }
        Ok(())
    }

    /// The flags given that mean something for some models only (a
    /// capability they have; see `ModelEntry::takes`).
    fn capabilities_given(&self) -> Vec<&'static str> {
        let job = &self.job;
        [
            (job.ddp.sparse_grads != SparseGrads::Auto, "--sparse-grads"),
            (job.train.sparse_adam, "--sparse-adam"),
            (job.pipeline.pipeline_stages > 1, "--pipeline-stages"),
            (job.train.accumulate_steps > 1, "--accumulate-steps"),
            (job.ddp.comm_hook != CommHookChoice::None, "--comm-hook"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect()
    }
}
