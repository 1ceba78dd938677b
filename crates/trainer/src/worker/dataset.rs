//! What the ranks train on, by `--model`: FashionMNIST for the CNN,
//! generated samples for the toy, a MovieLens ratings index for recsys.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use fashion_mnist::FashionMnist;

use crate::cli::{Cli, ModelChoice};
use crate::model::cnn::HostSplit;
use crate::model::recsys::{RatingsIndex, table};
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
    /// `local_ranks`: the ranks on this machine, each training a copy of
    /// the model.
    pub(super) fn load(cli: &Cli, local_ranks: usize) -> anyhow::Result<Self> {
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
                let dim = cli.embedding_dim.unwrap_or(32) as usize;
                // Before anything of the model's size is made.
                table::check_fits(&index, dim, local_ranks, host_room_bytes())?;
                Dataset::Recsys {
                    index: Arc::new(index),
                    dim,
                }
            }
        })
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
