//! The CNN's trainer on FashionMNIST's splits in host memory, made in one
//! call (what tests and benches build): the whole model, or a pipeline
//! stage.

use std::ops::Range;

use core_tensor::Ops;
use fashion_mnist::FashionMnist;

use super::{CnnMnist, DeviceSplit, HostSplit};
use crate::comm_thread::CommThread;
use crate::pipeline::{Pipeline, StageData, StageLink};
use crate::train::{Setup, TrainConfig, Trainer};

impl<B: Ops> Trainer<B, CnnMnist> {
    /// A fresh CNN replica (every rank starts from rank 0's seeded
    /// parameters), averaging over `comm`.
    pub fn new(
        backend: B,
        data: &FashionMnist,
        cfg: TrainConfig,
        comm: Option<CommThread>,
    ) -> anyhow::Result<Self> {
        Self::start(backend, data, cfg, Setup::fresh(comm))
    }

    /// The whole CNN's replica `setup` describes.
    pub fn start(
        backend: B,
        data: &FashionMnist,
        cfg: TrainConfig,
        setup: Setup<B>,
    ) -> anyhow::Result<Self> {
        let (train, test) = upload(&backend, data)?;
        let model = CnnMnist::new(cfg.dropout);
        Trainer::with_model(
            backend,
            model,
            Box::new(train),
            Some(Box::new(test)),
            cfg,
            setup,
        )
    }

    /// The CNN's stage of a pipeline `setup.topology` places this rank
    /// in, as `stage` says.
    pub fn pipeline_stage(
        backend: B,
        data: &FashionMnist,
        (cfg, setup): (TrainConfig, Setup<B>),
        stage: StageSpec<B>,
    ) -> anyhow::Result<Self> {
        let StageSpec {
            micro_batches,
            link,
            cut,
        } = stage;
        let (train, test) = upload(&backend, data)?;
        let splits = (
            Box::new(train) as StageData<B, CnnMnist>,
            Some(Box::new(test) as _),
        );
        let mut pipeline = Pipeline::new(&setup.topology, Some(micro_batches), link, splits)?;
        if let Some(runs) = cut {
            pipeline = pipeline.with_cut(runs);
        }
        let model = CnnMnist::new(cfg.dropout);
        Trainer::with_schedule(backend, model, Box::new(pipeline), cfg, setup)
    }
}

/// A pipeline stage's own settings.
pub struct StageSpec<B: Ops> {
    pub micro_batches: usize,
    /// The way to the other stages (stage `s` its rank `s`).
    pub link: Box<dyn StageLink<B>>,
    /// Each stage's segments; `None`: cut at the measured times.
    pub cut: Option<Vec<Range<usize>>>,
}

/// `data`'s splits on `backend`'s device.
fn upload<B: Ops>(
    backend: &B,
    data: &FashionMnist,
) -> anyhow::Result<(DeviceSplit<B>, DeviceSplit<B>)> {
    let train = HostSplit::from(data.train.clone());
    let test = HostSplit::from(data.test.clone());
    Ok((
        DeviceSplit::upload(backend, &train, "training")?,
        DeviceSplit::upload(backend, &test, "test")?,
    ))
}
