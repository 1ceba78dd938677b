//! A MovieLens recommender: user and movie embeddings (one table, users'
//! rows first) and a small MLP on their concatenation predict the rating;
//! MSE loss, Adam, test RMSE on a held-out 10%.
//!
//! ```text
//! [user row ; movie row] (2·dim) · fc1 → 64 · relu · fc2 → 1
//! ```
//!
//! The user and movie bias terms are the MLP's: `fc1` is linear in each
//! row, so a per-user and per-movie offset is one direction of it; `fc2`'s
//! bias starts at the training ratings' mean.

pub mod ratings;
mod shard;
pub mod synth;

use std::ops::Range;

use anyhow::Context as _;
use core_tensor::ops::EmbeddingGeom;
use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

pub use ratings::RatingsIndex;
pub use shard::RatingsShard;

use super::mlp::{Mlp, MlpBuffers};
use super::{GradsReady, Metric, Mode, Model, pytorch_default_init};

pub const HIDDEN: usize = 64;
/// Embedding rows start uniform in ±0.1 (a fan-in of 100 in
/// [`pytorch_default_init`]).
const EMBEDDING_FAN_IN: usize = 100;

/// The network for a file's ids.
#[derive(Clone, Debug)]
pub struct RecsysModel {
    rows: usize,
    dim: usize,
    mean: f32,
    layout: FlatLayout,
    embedding: Range<usize>,
    mlp: Mlp,
}

impl RecsysModel {
    /// Tables for `index`'s ids, rows of `dim`.
    pub fn new(index: &RatingsIndex, dim: usize) -> anyhow::Result<Self> {
        let rows = index.users as usize + index.items as usize;
        let layout = FlatLayout::new(vec![
            ParamSpec::new("embedding.weight", &[rows, dim]),
            ParamSpec::new("fc1.weight", &[HIDDEN, 2 * dim]),
            ParamSpec::new("fc1.bias", &[HIDDEN]),
            ParamSpec::new("fc2.weight", &[1, HIDDEN]),
            ParamSpec::new("fc2.bias", &[1]),
        ])?;
        Ok(Self {
            rows,
            dim,
            mean: index.mean as f32,
            embedding: layout.range("embedding.weight").context("declared above")?,
            mlp: Mlp::new(&layout, "fc1", "fc2")?,
            layout,
        })
    }

    /// Both rows of `batch` samples.
    fn lookup(&self, batch: usize) -> EmbeddingGeom {
        EmbeddingGeom {
            batch: 2 * batch,
            dim: self.dim,
            rows: self.rows,
            offset: self.embedding.start,
        }
    }
}

/// Every buffer one pass over `batch` ratings needs.
#[derive(Debug)]
pub struct RecsysBuffers<B: Ops> {
    pub batch: usize,
    /// Filled by [`RatingsShard`]: per rating its user's row, then its
    /// movie's; and the rating.
    pub ids: B::Storage<u32>,
    pub target: B::Storage<f32>,
    /// The two rows of each rating, side by side, and their gradient.
    x: B::Storage<f32>,
    dx: Option<B::Storage<f32>>,
    mlp: MlpBuffers<B>,
}

impl<B: Ops> Model<B> for RecsysModel {
    type Buffers = RecsysBuffers<B>;

    fn kind(&self) -> &'static str {
        "recsys"
    }

    fn metric(&self) -> Metric {
        Metric::Rmse
    }

    fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    fn sparse_table(&self) -> Option<(Range<usize>, usize)> {
        Some((self.embedding.clone(), self.dim))
    }

    fn init_params(&self, seed: u64) -> Vec<f32> {
        let d = 2 * self.dim;
        let mut params = pytorch_default_init(
            seed,
            &[
                (self.embedding.len(), EMBEDDING_FAN_IN),
                (HIDDEN * d, d),
                (HIDDEN, d),
                (HIDDEN, HIDDEN),
                (1, HIDDEN),
            ],
        );
        params[self.mlp.output_bias()] = self.mean;
        params
    }

    fn buffers(&self, b: &B, batch: usize, train: bool) -> Result<RecsysBuffers<B>> {
        let x = 2 * batch * self.dim;
        Ok(RecsysBuffers {
            batch,
            ids: b.zeros(2 * batch)?,
            target: b.zeros(batch)?,
            x: b.zeros(x)?,
            dx: train.then(|| b.zeros(x)).transpose()?,
            mlp: self.mlp.buffers(b, batch, train)?,
        })
    }

    fn forward(
        &self,
        b: &B,
        buf: &mut RecsysBuffers<B>,
        params: &B::Storage<f32>,
        _: Mode,
    ) -> Result<()> {
        b.embedding_fwd(&self.lookup(buf.batch), &buf.ids, params, &mut buf.x)?;
        self.mlp.forward(b, &buf.x, params, &mut buf.mlp)
    }

    /// The squared errors' sum.
    fn metric_sum(&self, b: &B, buf: &RecsysBuffers<B>, sum: &mut B::Storage<f32>) -> Result<()> {
        self.mlp.squared_error(b, &buf.mlp, &buf.target, sum)
    }

    fn loss(
        &self,
        b: &B,
        buf: &mut RecsysBuffers<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        self.mlp.mse(b, &mut buf.mlp, &buf.target, loss_sum)
    }

    fn backward(
        &self,
        b: &B,
        buf: &mut RecsysBuffers<B>,
        params: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
        _: u64,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let dx = buf
            .dx
            .as_mut()
            .context("backward needs buffers built for training")?;
        self.mlp
            .backward(b, &buf.x, params, grads, &mut buf.mlp, Some(dx), hook)?;
        b.embedding_bwd(&self.lookup(buf.batch), &buf.ids, dx, grads)?;
        hook.ready(b, grads, self.embedding.start)
    }
}
