//! What the trainer asks of a model: one trait, [`Model`], and what it
//! speaks of. The models themselves are plug-ins above the training loop
//! (`crate::models`).
//!
//! A model owns no tensors: it describes where its parameters live in one
//! flat buffer ([`Model::layout`], PyTorch `state_dict` names and order),
//! which buffers a pass over a batch needs ([`Model::Buffers`]), and how
//! forward, the loss and backward run on a backend. The trainer holds the
//! parameters, gradients and optimizer state, so every model gets data
//! parallelism, checkpoints and the finiteness guard for free. The data a
//! pass reads comes from a [`crate::data::Batches`] of the model's own,
//! which fills the model's input buffers. Each model is one folder.

mod init;
pub mod layered;
mod rows;

pub use init::{pytorch_default_init, unit_f32};
pub use layered::Layered;
pub use rows::{RowTables, row_room, row_table_geom};

use core_tensor::{FlatLayout, Ops, Result};

/// Drop probabilities of the two dropout layers, `(after pool, after fc1)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutRates {
    pub pool: f32,
    pub hidden: f32,
}

impl DropoutRates {
    /// The rates of the reference model.
    pub const REFERENCE: Self = Self {
        pool: 0.25,
        hidden: 0.5,
    };
    /// No dropout: used to compare data-parallel runs element for element.
    pub const OFF: Self = Self {
        pool: 0.0,
        hidden: 0.0,
    };
}

impl std::fmt::Display for DropoutRates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} after the pool, {} after fc1", self.pool, self.hidden)
    }
}

/// What a model reports besides its loss: the sum [`Model::metric_sum`]
/// accumulates over samples, and how a mean over samples becomes the
/// number reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Metric {
    /// The fraction of samples classified correctly (the sum counts them).
    Accuracy,
    /// The root of the mean squared error (the sum adds squared errors).
    Rmse,
    /// No metric: the loss alone (the test pass is skipped).
    None,
}

impl Metric {
    /// The short name on the epoch line (`acc`), `None` for no metric.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Metric::Accuracy => Some("acc"),
            Metric::Rmse => Some("rmse"),
            Metric::None => None,
        }
    }

    /// The reported value of a metric summed to `sum` over `count` samples.
    pub fn value(self, sum: f64, count: f64) -> f64 {
        match self {
            Metric::Accuracy => sum / count,
            Metric::Rmse => (sum / count).sqrt(),
            Metric::None => f64::NAN,
        }
    }
}

/// Which optimizer updates the parameters (the learning rate is the run's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimizer {
    /// PyTorch's `torch.optim.Adam` with its default betas and epsilon.
    Adam,
    /// Plain SGD, `p -= lr * g`, as `torch.optim.SGD` without momentum.
    Sgd,
}

/// Where a training batch's dropout masks come from: the seed of its step
/// (or micro-batch), and the place of its first sample in the batch the
/// masks are drawn for. A model's dropout layer keeps element `e` of the
/// batch's sample `r` as the element `(first_row + r) · features + e` of
/// the seed's stream (`core_tensor::rng::shifted`), so a slice of a batch
/// trained alone — a unit of a `--reproducible` step, on any rank — gets
/// the masks the whole batch would give its samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DropoutSeed {
    pub seed: u64,
    pub first_row: u64,
}

impl DropoutSeed {
    /// The masks of a batch of its own (its first sample at row 0).
    pub fn new(seed: u64) -> Self {
        Self { seed, first_row: 0 }
    }

    /// The seed of the layer whose stream `stream` derives from the step's
    /// and whose samples have `features` elements each.
    pub fn layer(&self, stream: u64, features: usize) -> u64 {
        let seed = core_tensor::rng::derive_seed(self.seed, &[stream]);
        core_tensor::rng::shifted(seed, self.first_row.wrapping_mul(features as u64))
    }
}

/// Whether a forward pass trains (dropout on, seeded per step) or evaluates.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Train { dropout_seed: DropoutSeed },
    Eval,
}

/// Receives, during backward, the news that every gradient from `offset` to
/// the end of the flat buffer is final: the hook for overlapping gradient
/// communication with the rest of the backward pass. The hook may rewrite
/// those final gradients (an in-place all-reduce does); backward only writes
/// below `offset` afterwards.
pub trait GradsReady<B: Ops> {
    fn ready(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        offset: usize,
    ) -> anyhow::Result<()>;
}

/// The hook of a backward pass with nothing to synchronise (one rank).
pub struct NoSync;

impl<B: Ops> GradsReady<B> for NoSync {
    fn ready(&mut self, _: &B, _: &mut B::Storage<f32>, _: usize) -> anyhow::Result<()> {
        Ok(())
    }
}

/// A network the trainer can train: structure, buffers, and the passes.
pub trait Model<B: Ops> {
    /// Every buffer one forward/backward pass over a batch needs, allocated
    /// once per batch size and reused.
    type Buffers;

    /// The model's name on the command line (`--model`), recorded in
    /// checkpoints.
    fn kind(&self) -> &'static str;

    /// What the model reports besides the loss.
    fn metric(&self) -> Metric;

    /// The optimizer the model trains with.
    fn optimizer(&self) -> Optimizer {
        Optimizer::Adam
    }

    /// Where each parameter lives in the flat buffer.
    fn layout(&self) -> &FlatLayout;

    /// Its row tables (recsys' embedding and per-row biases), if it has
    /// any: a capability the sparse gradient exchange, `--sparse-adam` and
    /// the finiteness guard use.
    fn row_tables(&self) -> Option<&dyn RowTables<Self::Buffers>> {
        None
    }

    /// Fresh parameters, deterministic in `seed`.
    fn init_params(&self, seed: u64) -> Vec<f32>;

    /// Buffers for `batch` samples; `train` false allocates only what
    /// evaluation needs.
    fn buffers(&self, backend: &B, batch: usize, train: bool) -> Result<Self::Buffers>;

    /// Runs the network on the inputs, keeping what backward needs.
    fn forward(
        &self,
        backend: &B,
        buffers: &mut Self::Buffers,
        params: &B::Storage<f32>,
        mode: Mode,
    ) -> Result<()>;

    /// Adds the batch's share of the [`Model::metric`] sum to `sum` (the
    /// correct predictions, for accuracy); nothing for [`Metric::None`].
    fn metric_sum(
        &self,
        backend: &B,
        buffers: &Self::Buffers,
        sum: &mut B::Storage<f32>,
    ) -> Result<()>;

    /// Adds the batch's summed loss to `loss_sum` and writes the loss
    /// gradient backward starts from.
    fn loss(
        &self,
        backend: &B,
        buffers: &mut Self::Buffers,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()>;

    /// Back-propagates the loss gradient, writing every parameter gradient
    /// into `grads` and telling `hook` as soon as each layer's gradients
    /// are final (last layer first). `dropout_seed` is the forward pass's.
    fn backward(
        &self,
        backend: &B,
        buffers: &mut Self::Buffers,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: DropoutSeed,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()>;
}
