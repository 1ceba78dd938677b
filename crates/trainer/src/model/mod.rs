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
mod rows;

pub use init::{pytorch_default_init, unit_f32};
pub use rows::{row_room, row_table_geom};

use std::ops::Range;

use core_tensor::{FlatLayout, Ops, Result};

use crate::phases::PhaseSeconds;

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

/// Whether a forward pass trains (dropout on, seeded per step) or evaluates.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    Train { dropout_seed: u64 },
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

/// How the parameters are split between ranks that train one part each
/// (pipeline stages): rank `r` trains part `r % parts.len()`, and its part's
/// gradients are averaged over the `replicas` ranks training the same part.
/// Rank `p` (`p < parts.len()`, the first replica) is where the whole model
/// is assembled from, part by part, for checkpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Each part's range of the flat parameter buffer, in order.
    pub parts: Vec<Range<usize>>,
    /// The part this rank trains.
    pub part: usize,
    /// The ranks training each part.
    pub replicas: usize,
}

impl Partition {
    /// The range this rank trains.
    pub fn mine(&self) -> Range<usize> {
        self.parts[self.part].clone()
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

    /// The part of the flat gradient that is a row-sparse table (its range
    /// and row width): a step writes only the rows its batch looked up, so
    /// ranks may exchange those rows instead of the whole table. `None`
    /// when every gradient is dense.
    fn sparse_table(&self) -> Option<(Range<usize>, usize)> {
        None
    }

    /// The rows of [`Model::sparse_table`] the batch last filled into
    /// `buffers` looks up, increasing, each once: the only rows backward
    /// writes other than `+0.0`, so the only ones a sparse exchange moves.
    /// `None` for a model without a sparse table.
    fn sparse_rows<'a>(&self, _buffers: &'a Self::Buffers) -> Option<&'a [u32]> {
        None
    }

    /// Every table (range and row width) whose rows the ids of
    /// [`Model::sparse_rows`] name: [`Model::sparse_table`] and any other
    /// table the batch looks up with the same ids (recsys' per-row biases,
    /// a table of width 1), as PyTorch would hold each in an
    /// `nn.Embedding(sparse=True)`. The sparse gradient exchange moves
    /// those rows of each (and keeps every table out of the dense buckets),
    /// `--sparse-adam` updates them lazily, and the finiteness guard reads
    /// only them. Backward must write `+0.0` to every other row of each.
    /// The default: the sparse table alone.
    fn row_tables(&self) -> Vec<(Range<usize>, usize)> {
        self.sparse_table().into_iter().collect()
    }

    /// The trainer promises that the gradient of every table of
    /// [`Model::row_tables`] is all `+0.0` whenever backward begins (it
    /// zeroes the rows it used after each step), so backward may add the
    /// batch's rows into them instead of zeroing the whole tables first.
    fn row_tables_kept_zero(&mut self) {}

    /// The part of the parameters this rank trains, when it trains only a
    /// part (a pipeline stage); `None` (the default): all of them.
    fn partition(&self) -> Option<Partition> {
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
    /// With a [`Model::partition`], `grads` holds the rank's part only
    /// (element 0 is the part's first parameter), and so do the offsets
    /// `hook` hears.
    fn backward(
        &self,
        backend: &B,
        buffers: &mut Self::Buffers,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        dropout_seed: u64,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()>;

    /// The seconds of the last training [`Model::forward`] that belong to
    /// other step phases (a pipeline stage runs its micro-batches' backward
    /// passes and waits for the other stage inside it), in device time;
    /// `None` (the default): forward did forward work only.
    fn forward_split(&self, _backend: &B) -> Result<Option<PhaseSeconds>> {
        Ok(None)
    }
}
