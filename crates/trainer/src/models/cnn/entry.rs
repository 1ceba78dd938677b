//! `--model cnn`: the FashionMNIST CNN on the data set's four files, read
//! once per process and resident on each rank's device.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use core_tensor::Ops;
use fashion_mnist::FashionMnist;
use launcher::contract::Misconfigured;

use super::{CnnMnist, DeviceSplit, HostSplit};
use crate::model::DropoutRates;
use crate::models::{ModelData, ModelEntry, ModelFlags};
use crate::rank::Rank;
use crate::train::RunOutcome;

/// Its `--model` name.
pub const NAME: &str = "cnn";

pub static ENTRY: CnnEntry = CnnEntry;

/// The CNN's own flags.
#[derive(Clone, Debug, Args)]
pub struct CnnFlags {
    /// Directory holding the four FashionMNIST .gz files.
    ///
    /// [default: see DATA below]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,

    /// Disable both dropout layers (for checking data-parallel equivalence).
    #[arg(long)]
    pub no_dropout: bool,

    /// Evaluate on the test split's first N images [default: all 10,000].
    ///
    /// A coarser test accuracy, sooner: for smoke runs, the test suite and
    /// the GPU bundle's dry run on cuda-emu. Training is not affected.
    #[arg(long, value_name = "N")]
    pub eval_samples: Option<NonZeroUsize>,
}

pub struct CnnEntry;

impl ModelEntry for CnnEntry {
    fn name(&self) -> &'static str {
        NAME
    }

    fn about(&self) -> &'static str {
        "the FashionMNIST CNN (Adam; --data-dir)"
    }

    fn pytorch_class(&self) -> &'static str {
        "CNN_MNIST"
    }

    fn own_flags_given(&self, flags: &ModelFlags) -> Vec<&'static str> {
        let own = &flags.cnn;
        [
            (own.data_dir.is_some(), "--data-dir"),
            (own.no_dropout, "--no-dropout"),
            (own.eval_samples.is_some(), "--eval-samples"),
        ]
        .into_iter()
        .filter_map(|(given, flag)| given.then_some(flag))
        .collect()
    }

    fn takes(&self) -> &'static [&'static str] {
        &["--pipeline-stages", "--accumulate-steps", "--comm-hook"]
    }

    fn max_stages(&self) -> usize {
        4
    }

    fn dropout(&self, flags: &ModelFlags) -> DropoutRates {
        match flags.cnn.no_dropout {
            true => DropoutRates::OFF,
            false => DropoutRates::REFERENCE,
        }
    }

    fn load(&self, flags: &ModelFlags) -> Result<Box<dyn crate::models::Loaded>> {
        let dir = fashion_mnist::locate(flags.cnn.data_dir.as_deref())?;
        let FashionMnist { train, test, .. } = FashionMnist::load(&dir)?;
        let test = match flags.cnn.eval_samples {
            Some(n) if n.get() > test.len => bail!(Misconfigured(format!(
                "--eval-samples {n}: the test split holds {} images; give at most that, or leave the flag out",
                test.len
            ))),
            Some(n) => test.first(n.get()),
            None => test,
        };
        Ok(Box::new(FashionData {
            train: train.into(),
            test: test.into(),
            dir,
        }))
    }
}

/// FashionMNIST's splits, read-only in host memory: CPU ranks train on
/// these very bytes.
struct FashionData {
    train: HostSplit,
    test: HostSplit,
    dir: PathBuf,
}

impl ModelData for FashionData {
    fn describe(&self, _seed: u64) -> String {
        format!("data from {}", self.dir.display())
    }

    fn train<B: Ops>(&self, rank: Rank<'_, B>) -> Result<RunOutcome> {
        let b = &rank.backend;
        let upload = || -> Result<(DeviceSplit<B>, DeviceSplit<B>)> {
            let train = DeviceSplit::upload(b, &self.train, "training")?;
            let test = DeviceSplit::upload(b, &self.test, "test")?;
            Ok((train, test))
        };
        let (train, test) =
            upload().with_context(|| format!("rank {}: setting up", rank.topology.rank))?;
        let model = CnnMnist::new(rank.cfg.dropout);
        rank.train_layered(model, (train, Some(test)))
    }
}
