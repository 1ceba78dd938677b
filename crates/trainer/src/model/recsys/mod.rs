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
use core_tensor::ops::{EmbeddingGeom, LinearGeom, MseGeom, ParamAt};
use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

pub use ratings::RatingsIndex;
pub use shard::RatingsShard;

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
    fc1: ParamAt,
    fc2: ParamAt,
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
        let range = |name: &str| layout.range(name).context("declared above");
        let at = |layer: &str| -> anyhow::Result<ParamAt> {
            Ok(ParamAt {
                weight: range(&format!("{layer}.weight"))?,
                bias: range(&format!("{layer}.bias"))?,
            })
        };
        Ok(Self {
            rows,
            dim,
            mean: index.mean as f32,
            embedding: range("embedding.weight")?,
            fc1: at("fc1")?,
            fc2: at("fc2")?,
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

    fn fc1(&self, batch: usize) -> LinearGeom {
        LinearGeom {
            batch,
            in_features: 2 * self.dim,
            out_features: HIDDEN,
        }
    }
}

fn fc2(batch: usize) -> LinearGeom {
    LinearGeom {
        batch,
        in_features: HIDDEN,
        out_features: 1,
    }
}

fn ratings(batch: usize) -> MseGeom {
    MseGeom { batch, features: 1 }
}

/// Every buffer one pass over `batch` ratings needs.
#[derive(Debug)]
pub struct RecsysBuffers<B: Ops> {
    pub batch: usize,
    /// Filled by [`RatingsShard`]: per rating its user's row, then its
    /// movie's; and the rating.
    pub ids: B::Storage<u32>,
    pub target: B::Storage<f32>,
    x: B::Storage<f32>,
    hidden: B::Storage<f32>,
    pred: B::Storage<f32>,
    /// `(dpred, dhidden, dx)`, for training only.
    grads: Option<[B::Storage<f32>; 3]>,
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
        params[self.fc2.bias.start] = self.mean;
        params
    }

    fn buffers(&self, b: &B, batch: usize, train: bool) -> Result<RecsysBuffers<B>> {
        let x = 2 * batch * self.dim;
        let grads = train
            .then(|| {
                Ok::<_, core_tensor::Error>([
                    b.zeros(batch)?,
                    b.zeros(batch * HIDDEN)?,
                    b.zeros(x)?,
                ])
            })
            .transpose()?;
        Ok(RecsysBuffers {
            batch,
            ids: b.zeros(2 * batch)?,
            target: b.zeros(batch)?,
            x: b.zeros(x)?,
            hidden: b.zeros(batch * HIDDEN)?,
            pred: b.zeros(batch)?,
            grads,
        })
    }

    fn forward(
        &self,
        b: &B,
        buf: &mut RecsysBuffers<B>,
        params: &B::Storage<f32>,
        _: Mode,
    ) -> Result<()> {
        let n = buf.batch;
        b.embedding_fwd(&self.lookup(n), &buf.ids, params, &mut buf.x)?;
        b.linear_fwd(&self.fc1(n), &buf.x, params, &self.fc1, &mut buf.hidden)?;
        b.relu_fwd(&mut buf.hidden)?;
        b.linear_fwd(&fc2(n), &buf.hidden, params, &self.fc2, &mut buf.pred)
    }

    /// The squared errors' sum.
    fn metric_sum(&self, b: &B, buf: &RecsysBuffers<B>, sum: &mut B::Storage<f32>) -> Result<()> {
        b.mse_fwd_bwd(&ratings(buf.batch), &buf.pred, &buf.target, None, sum)
    }

    fn loss(
        &self,
        b: &B,
        buf: &mut RecsysBuffers<B>,
        loss_sum: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        let [dpred, ..] = buf
            .grads
            .as_mut()
            .context("the loss gradient needs buffers built for training")?;
        let geom = ratings(buf.batch);
        Ok(b.mse_fwd_bwd(&geom, &buf.pred, &buf.target, Some(dpred), loss_sum)?)
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
        let n = buf.batch;
        let [dpred, dhidden, dx] = buf
            .grads
            .as_mut()
            .context("backward needs buffers built for training")?;
        b.linear_bwd(
            &fc2(n),
            &buf.hidden,
            params,
            &self.fc2,
            dpred,
            grads,
            Some(dhidden),
        )?;
        hook.ready(b, grads, self.fc2.weight.start)?;
        b.relu_bwd(&buf.hidden, dhidden)?;
        b.linear_bwd(
            &self.fc1(n),
            &buf.x,
            params,
            &self.fc1,
            dhidden,
            grads,
            Some(dx),
        )?;
        hook.ready(b, grads, self.fc1.weight.start)?;
        b.embedding_bwd(&self.lookup(n), &buf.ids, dx, grads)?;
        hook.ready(b, grads, self.embedding.start)
    }
}
