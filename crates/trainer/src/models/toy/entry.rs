//! `--model toy`: PyTorch's DDP-tutorial ToyModel on samples generated
//! from the run's seed.

use anyhow::Result;
use clap::Args;
use core_tensor::Ops;

use super::{ToyData, ToyModel};
use crate::models::{Loaded, ModelData, ModelEntry, ModelFlags};
use crate::rank::Rank;
use crate::train::RunOutcome;

/// Its `--model` name.
pub const NAME: &str = "toy";

/// Samples when `--samples` is not given.
const DEFAULT_SAMPLES: u64 = 8192;

pub static ENTRY: ToyEntry = ToyEntry;

/// The toy's own flags.
#[derive(Clone, Debug, Args)]
pub struct ToyFlags {
    /// Synthetic samples for --model toy [default: 8192].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=(1 << 32)))]
    pub samples: Option<u64>,
}

pub struct ToyEntry;

impl ModelEntry for ToyEntry {
    fn name(&self) -> &'static str {
        NAME
    }

    fn about(&self) -> &'static str {
        "PyTorch's DDP-tutorial ToyModel (Linear 10->10, ReLU, Linear 10->5, MSE, SGD) on --samples synthetic samples generated from --seed"
    }

    fn pytorch_class(&self) -> &'static str {
        "ToyModel"
    }

    fn takes(&self) -> &'static [&'static str] {
        &["--pipeline-stages", "--accumulate-steps", "--comm-hook"]
    }

    /// net1 and its ReLU | net2.
    fn max_stages(&self) -> usize {
        2
    }

    fn own_flags_given(&self, flags: &ModelFlags) -> Vec<&'static str> {
        match flags.toy.samples {
            Some(_) => vec!["--samples"],
            None => Vec::new(),
        }
    }

    fn load(&self, flags: &ModelFlags) -> Result<Box<dyn Loaded>> {
        let samples = flags.toy.samples.unwrap_or(DEFAULT_SAMPLES);
        Ok(Box::new(ToySamples {
            samples: usize::try_from(samples)?,
        }))
    }
}

/// How many samples each rank generates (the same ones on every rank).
struct ToySamples {
    samples: usize,
}

impl ModelData for ToySamples {
    fn describe(&self, seed: u64) -> String {
        format!(
            "model toy, {} synthetic samples from seed {seed}",
            self.samples
        )
    }

    fn train<B: Ops>(&self, rank: Rank<'_, B>) -> Result<RunOutcome> {
        let data = ToyData::generate(rank.cfg.seed, self.samples);
        rank.train_layered(ToyModel::default(), (data, None))
    }
}
