//! What the ranks train on, by `--model`: FashionMNIST for the CNN,
//! generated samples for the toy, a MovieLens ratings index for recsys.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use fashion_mnist::FashionMnist;

use super::RankInfo;
use super::device::{Device, ranks_on};
use crate::cli::{BackendChoice, Cli, ModelChoice};
use crate::model::cnn::HostSplit;
use crate::model::recsys::RatingsIndex;
use crate::model::recsys::table::{self, Footprint, GpuRoom};
use crate::train::host_room_bytes;

/// What the ranks train on, loaded before the device is chosen, once per
/// process: rank threads share it.
pub(super) enum Dataset {
    /// The splits read-only, so that CPU ranks train on these very bytes.
    Fashion {
        train: HostSplit,
        test: HostSplit,
        dir: PathBuf,
    },
    Toy {
        samples: usize,
    },
    Recsys {
        index: Arc<RatingsIndex>,
        dim: usize,
    },
}

impl Dataset {
    pub(super) fn load(cli: &Cli) -> anyhow::Result<Self> {
        Ok(match cli.model {
            ModelChoice::Cnn => {
                let dir = fashion_mnist::locate(cli.data_dir.as_deref())?;
                let FashionMnist { train, test, .. } = FashionMnist::load(&dir)?;
                Dataset::Fashion {
                    train: train.into(),
                    test: test.into(),
                    dir,
                }
            }
            ModelChoice::Toy => Dataset::Toy {
                samples: usize::try_from(cli.samples.unwrap_or(8192))?,
            },
            ModelChoice::Recsys => {
                let path = cli
                    .ratings
                    .as_deref()
                    .context("--model recsys needs --ratings")?;
                let index = RatingsIndex::build(path)?;
                Dataset::Recsys {
                    index: Arc::new(index),
                    dim: cli.embedding_dim.unwrap_or(32) as usize,
                }
            }
        })
    }

    /// Refuses a recsys table that this machine's memory or `device`'s
    /// cannot hold: called once the device is chosen, before anything of
    /// the model's size is made and before the rendezvous.
    pub(super) fn check_room(
        &self,
        cli: &Cli,
        info: &RankInfo,
        device: &Device,
    ) -> anyhow::Result<()> {
        self.check_host(cli, info, device.is_gpu())?;
        self.check_device(info, device)
    }

    /// Refuses a recsys table that this machine's memory cannot hold, its
    /// ranks together (on GPUs, which then hold their replicas, if `gpu`).
    pub(super) fn check_host(&self, cli: &Cli, info: &RankInfo, gpu: bool) -> anyhow::Result<()> {
        let Dataset::Recsys { index, dim } = self else {
            return Ok(());
        };
        // Ranks are numbered machine by machine: rank 0 is here when this
        // machine's first rank is.
        let rank_0_here = info.rank == info.local_rank;
        let footprint = Footprint {
            gpu,
            local_ranks: info.local_world_size,
            // Counted unless NCCL is asked for: `auto` may use the host.
            host_exchange: info.world_size > 1 && !(gpu && cli.backend == BackendChoice::Nccl),
            saves: rank_0_here && cli.checkpoint_dir.is_some(),
            loads: rank_0_here && cli.resume.is_some(),
        };
        table::check_fits(index, *dim, &footprint, host_room_bytes())
    }

    /// Refuses a recsys table that `device`'s memory cannot hold (nothing
    /// to check on the CPU: [`Dataset::check_host`] counts it).
    pub(super) fn check_device(&self, info: &RankInfo, device: &Device) -> anyhow::Result<()> {
        let (Dataset::Recsys { index, dim }, Device::Cuda { gpu, gpus }) = (self, device) else {
            return Ok(());
        };
        let name = format!("cuda:{} ({})", gpu.ordinal(), gpu.name());
        let (free, total) = gpu
            .memory()
            .with_context(|| format!("rank {}: asking {name} for its free memory", info.rank))?;
        let room = GpuRoom {
            ranks: ranks_on(gpu, *gpus, info),
            name,
            free,
            total,
        };
        table::check_gpu_fits(index, *dim, &room)
    }

    /// For the start-up line.
    pub(super) fn describe(&self, seed: u64) -> String {
        match self {
            Dataset::Fashion { dir, .. } => format!("data from {}", dir.display()),
            Dataset::Toy { samples } => {
                format!("model toy, {samples} synthetic samples from seed {seed}")
            }
            Dataset::Recsys { index, .. } => {
                let (train, test) = index.counts();
                format!(
                    "model recsys, {train} training and {test} test ratings from {} (ratings' mean {:.3}, std {:.3})",
                    index.path.display(),
                    index.mean,
                    index.std
                )
            }
        }
    }
}
