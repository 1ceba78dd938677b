//! `--model recsys`: the MovieLens recommender on a ratings.csv, indexed
//! once per process and streamed in shards by every rank.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Result, bail};
use clap::Args;
use core_tensor::Ops;
use launcher::contract::Misconfigured;

use super::table::{check_fits, check_gpu_fits};
use super::{RatingsIndex, RatingsShard, RecsysModel};
use crate::data::Batches;
use crate::models::{Footprint, GpuRoom, Loaded, ModelData, ModelEntry, ModelFlags};
use crate::rank::{Rank, Splits};
use crate::train::RunOutcome;

/// Its `--model` name.
pub const NAME: &str = "recsys";

/// `--embedding-dim` when not given.
const DEFAULT_DIM: u32 = 32;

pub static ENTRY: RecsysEntry = RecsysEntry;

/// The recommender's own flags.
#[derive(Clone, Debug, Args)]
pub struct RecsysFlags {
    /// MovieLens ratings.csv for --model recsys.
    ///
    /// `cargo xtask fetch-data movielens` downloads ml-latest-small.
    #[arg(long, value_name = "PATH")]
    pub ratings: Option<PathBuf>,

    /// Embedding size of --model recsys [default: 32].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub embedding_dim: Option<u32>,
}

pub struct RecsysEntry;

impl ModelEntry for RecsysEntry {
    fn name(&self) -> &'static str {
        NAME
    }

    fn about(&self) -> &'static str {
        "a MovieLens recommender (user and movie embeddings, an MLP, MSE, Adam; test RMSE on a held-out 10%) on --ratings, streamed in shards"
    }

    fn pytorch_class(&self) -> &'static str {
        "recommender"
    }

    fn own_flags_given(&self, flags: &ModelFlags) -> Vec<&'static str> {
        let own = &flags.recsys;
        [
            (own.ratings.is_some(), "--ratings"),
            (own.embedding_dim.is_some(), "--embedding-dim"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect()
    }

    /// Its row tables travel and update row by row.
    fn takes(&self) -> &'static [&'static str] {
        &["--sparse-grads", "--sparse-adam"]
    }

    fn check(&self, flags: &ModelFlags) -> Result<()> {
        if flags.recsys.ratings.is_none() {
            bail!("--model recsys trains on --ratings PATH (a MovieLens ratings.csv)");
        }
        Ok(())
    }

    fn load(&self, flags: &ModelFlags) -> Result<Box<dyn Loaded>> {
        let Some(path) = flags.recsys.ratings.as_deref() else {
            bail!("--model recsys needs --ratings");
        };
        Ok(Box::new(Ratings {
            index: Arc::new(RatingsIndex::build(path)?),
            dim: flags.recsys.embedding_dim.unwrap_or(DEFAULT_DIM) as usize,
        }))
    }
}

/// The ratings file's index, which every rank's shards read from.
struct Ratings {
    index: Arc<RatingsIndex>,
    dim: usize,
}

impl ModelData for Ratings {
    fn describe(&self, _seed: u64) -> String {
        let index = &self.index;
        let (train, test) = index.counts();
        format!(
            "model recsys, {train} training and {test} test ratings from {} (ratings' mean {:.3}, std {:.3})",
            index.path.display(),
            index.mean,
            index.std
        )
    }

    /// Refuses a table whose copies this machine's memory cannot hold.
    fn check_host(&self, footprint: &Footprint, room: Option<u64>) -> Result<()> {
        check_fits(&self.index, self.dim, footprint, room)
    }

    /// Refuses a table whose replica a GPU cannot hold.
    fn check_gpu(&self, gpu: &GpuRoom) -> Result<()> {
        check_gpu_fits(&self.index, self.dim, gpu)
    }

    fn train<B: Ops>(&self, rank: Rank<'_, B>) -> Result<RunOutcome> {
        if rank.job.outputs.sample_ledger.is_some() {
            bail!(Misconfigured(
                "--sample-ledger lists the samples of one sampling order, and the ratings stream in chunks shuffled per rank: leave it out with --model recsys".to_string()
            ));
        }
        let kept_zero = rank.cfg.sparse_adam;
        let model = RecsysModel::new(&self.index, self.dim)?.with_tables_kept_zero(kept_zero);
        let train = RatingsShard::new(self.index.clone(), false);
        let test: Box<dyn Batches<B, _>> = Box::new(RatingsShard::new(self.index.clone(), true));
        let splits: Splits<B, RecsysModel> = (Box::new(train), Some(test));
        rank.train(model, splits)
    }
}
