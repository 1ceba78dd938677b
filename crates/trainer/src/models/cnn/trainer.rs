//! The CNN's trainer on FashionMNIST's splits in host memory, made in one
//! call (what tests and benches build).

use core_tensor::Ops;
use fashion_mnist::FashionMnist;

use super::{BatchInputs, CnnMnist, DeviceSplit, HostSplit};
use crate::comm_thread::CommThread;
use crate::data::Batches;
use crate::model::Model;
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

    /// The CNN replica `setup` describes.
    pub fn start(
        backend: B,
        data: &FashionMnist,
        cfg: TrainConfig,
        setup: Setup<B>,
    ) -> anyhow::Result<Self> {
        let model = CnnMnist::new(cfg.dropout);
        Trainer::on_fashion_mnist(backend, model, data, cfg, setup)
    }
}

impl<B: Ops, M: Model<B>> Trainer<B, M>
where
    M::Buffers: BatchInputs<B>,
{
    /// A replica of `model`, a network over the CNN's buffers (the CNN, or
    /// a pipeline stage of it), trained and evaluated on `data`.
    pub fn on_fashion_mnist(
        backend: B,
        model: M,
        data: &FashionMnist,
        cfg: TrainConfig,
        setup: Setup<B>,
    ) -> anyhow::Result<Self> {
        let train = HostSplit::from(data.train.clone());
        let test = HostSplit::from(data.test.clone());
        let train = DeviceSplit::upload(&backend, &train, "training")?;
        let test = DeviceSplit::upload(&backend, &test, "test")?;
        let test: Box<dyn Batches<B, M::Buffers>> = Box::new(test);
        Trainer::with_model(backend, model, Box::new(train), Some(test), cfg, setup)
    }
}
