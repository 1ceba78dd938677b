//! A MovieLens recommender: user and movie embeddings (one table, users'
//! rows first) and a small MLP on their concatenation, plus a bias per user
//! and per movie, predict the rating; MSE loss, Adam, test RMSE on a
//! held-out 10%.
//!
//! ```text
//! [user row ; movie row] (2·dim) · fc1 → 64 · relu · fc2 → 1
//!     + user bias + movie bias
//! ```
//!
//! `fc2`'s bias starts at the training ratings' mean, the user and movie
//! biases at zero.

mod entry;
pub mod ratings;
mod shard;
pub mod synth;
pub mod table;

use std::ops::Range;

use anyhow::Context as _;
use core_tensor::ops::{EmbeddingGeom, OffsetGeom};
use core_tensor::{FlatLayout, Ops, ParamSpec, Result};

pub use entry::{ENTRY, NAME, RecsysFlags};
pub use ratings::RatingsIndex;
pub use shard::RatingsShard;

use super::mlp::{Mlp, MlpBuffers};
use crate::model::{DropoutSeed, GradsReady, Metric, Mode, Model, RowTables, pytorch_default_init};

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
    /// One bias per row of the embedding table (users', then movies').
    biases: Range<usize>,
    /// Backward adds into the gradients of the table and the biases, which
    /// the trainer then keeps zero (`--sparse-adam`'s lazy step does),
    /// instead of overwriting them.
    tables_kept_zero: bool,
    mlp: Mlp,
}

impl RecsysModel {
    /// Tables for `index`'s ids, rows of `dim`.
    pub fn new(index: &RatingsIndex, dim: usize) -> anyhow::Result<Self> {
        let rows = index.users as usize + index.items as usize;
        let layout = FlatLayout::new(vec![
            ParamSpec::new("embedding.weight", &[rows, dim]),
            ParamSpec::new("bias.weight", &[rows, 1]),
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
            biases: layout.range("bias.weight").context("declared above")?,
            tables_kept_zero: false,
            mlp: Mlp::new(&layout, "fc1", "fc2")?,
            layout,
        })
    }

    /// The model whose backward adds into its tables' gradients
    /// (`kept_zero`), which the trainer keeps zero between steps (see
    /// [`RowTables::adds_into_zeroed_tables`]), or overwrites them.
    pub fn with_tables_kept_zero(self, kept_zero: bool) -> Self {
        Self {
            tables_kept_zero: kept_zero,
            ..self
        }
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

    /// The backward of a lookup in `geom`'s table: adds into its gradient
    /// where the trainer keeps that zero, else overwrites it.
    fn lookup_bwd<B: Ops>(
        &self,
        b: &B,
        geom: &EmbeddingGeom,
        ids: &B::Storage<u32>,
        dout: &B::Storage<f32>,
        grads: &mut B::Storage<f32>,
    ) -> Result<()> {
        match self.tables_kept_zero {
            true => b.embedding_bwd_add(geom, ids, dout, grads),
            false => b.embedding_bwd(geom, ids, dout, grads),
        }
    }

    /// Each of `batch` predictions gets its two biases.
    fn offsets(&self, batch: usize) -> OffsetGeom {
        OffsetGeom { batch, k: 2 }
    }

    /// Both biases of `batch` samples (the same ids, a table of width 1).
    fn bias_lookup(&self, batch: usize) -> EmbeddingGeom {
        EmbeddingGeom {
            batch: 2 * batch,
            dim: 1,
            rows: self.rows,
            offset: self.biases.start,
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
    /// The table rows `ids` names, increasing, each once (on the host).
    rows: Vec<u32>,
    /// The two rows of each rating, side by side, and their gradient.
    x: B::Storage<f32>,
    dx: Option<B::Storage<f32>>,
    /// The user and movie bias of each rating, and their gradient.
    bias: B::Storage<f32>,
    dbias: Option<B::Storage<f32>>,
    mlp: MlpBuffers<B>,
}

impl<B: Ops> Model<B> for RecsysModel {
    type Buffers = RecsysBuffers<B>;

    fn kind(&self) -> &'static str {
        NAME
    }

    fn metric(&self) -> Metric {
        Metric::Rmse
    }

    fn layout(&self) -> &FlatLayout {
        &self.layout
    }

    fn row_tables(&self) -> Option<&dyn RowTables<RecsysBuffers<B>>> {
        Some(self)
    }

    fn init_params(&self, seed: u64) -> Vec<f32> {
        let d = 2 * self.dim;
        let mut params = pytorch_default_init(
            seed,
            &[
                (self.embedding.len(), EMBEDDING_FAN_IN),
                (self.biases.len(), 1),
                (HIDDEN * d, d),
                (HIDDEN, d),
                (HIDDEN, HIDDEN),
                (1, HIDDEN),
            ],
        );
        params[self.biases.clone()].fill(0.0);
        params[self.mlp.output_bias()] = self.mean;
        params
    }

    fn buffers(&self, b: &B, batch: usize, train: bool) -> Result<RecsysBuffers<B>> {
        let x = 2 * batch * self.dim;
        Ok(RecsysBuffers {
            batch,
            ids: b.zeros(2 * batch)?,
            target: b.zeros(batch)?,
            rows: Vec::with_capacity(2 * batch),
            x: b.zeros(x)?,
            dx: train.then(|| b.zeros(x)).transpose()?,
            bias: b.zeros(2 * batch)?,
            dbias: train.then(|| b.zeros(2 * batch)).transpose()?,
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
        self.mlp.forward(b, &buf.x, params, &mut buf.mlp)?;
        b.embedding_fwd(
            &self.bias_lookup(buf.batch),
            &buf.ids,
            params,
            &mut buf.bias,
        )?;
        b.offset_fwd(&self.offsets(buf.batch), &buf.bias, &mut buf.mlp.out)
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
        _: DropoutSeed,
        hook: &mut dyn GradsReady<B>,
    ) -> anyhow::Result<()> {
        let training = "backward needs buffers built for training";
        let (dx, dbias) = (
            buf.dx.as_mut().context(training)?,
            buf.dbias.as_mut().context(training)?,
        );
        self.mlp
            .backward(b, &buf.x, params, grads, &mut buf.mlp, Some(dx), hook)?;
        let dout = buf.mlp.dout().context(training)?;
        b.offset_bwd(&self.offsets(buf.batch), dout, dbias)?;
        self.lookup_bwd(b, &self.bias_lookup(buf.batch), &buf.ids, dbias, grads)?;
        hook.ready(b, grads, self.biases.start)?;
        self.lookup_bwd(b, &self.lookup(buf.batch), &buf.ids, dx, grads)?;
        hook.ready(b, grads, self.embedding.start)
    }
}

impl<B: Ops> RowTables<RecsysBuffers<B>> for RecsysModel {
    /// The table and the biases, which the same ids look up.
    fn tables(&self) -> Vec<(Range<usize>, usize)> {
        vec![(self.embedding.clone(), self.dim), (self.biases.clone(), 1)]
    }

    fn rows<'a>(&self, buf: &'a RecsysBuffers<B>) -> &'a [u32] {
        &buf.rows
    }

    fn adds_into_zeroed_tables(&self) -> bool {
        self.tables_kept_zero
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use core_tensor::{Backend, Cpu};

    use super::*;
    use crate::data::{Batches, Order};

    /// A prediction moves by exactly its user's and its movie's bias, and
    /// backward hands each bias the prediction's gradient.
    #[test]
    fn each_rating_gets_its_users_and_its_movies_bias() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        synth::write_ratings(&path, 200, 5, 7, 1).unwrap();
        let model = RecsysModel::new(&RatingsIndex::build(&path).unwrap(), 4).unwrap();
        let b = Cpu::new(1).unwrap();
        let predict = |params: &[f32]| -> (f32, Vec<f32>) {
            let mut buf = Model::<Cpu>::buffers(&model, &b, 1, true).unwrap();
            buf.ids = vec![1, 6];
            buf.target = vec![3.0];
            let params = b.upload(params).unwrap();
            model.forward(&b, &mut buf, &params, Mode::Eval).unwrap();
            let out = buf.mlp.out[0];
            let mut loss = vec![0.0];
            model.loss(&b, &mut buf, &mut loss).unwrap();
            let mut grads = vec![0.0; params.len()];
            let mut hook = crate::model::NoSync;
            model
                .backward(
                    &b,
                    &mut buf,
                    &params,
                    &mut grads,
                    DropoutSeed::default(),
                    &mut hook,
                )
                .unwrap();
            (out, grads)
        };
        let mut params = Model::<Cpu>::init_params(&model, 3);
        assert!(params[model.biases.clone()].iter().all(|&p| p == 0.0));
        let (plain, grads) = predict(&params);
        params[model.biases.start + 1] = 0.5;
        params[model.biases.start + 6] = 0.25;
        let (biased, _) = predict(&params);
        assert_eq!(biased, plain + 0.5 + 0.25);
        let dout = 2.0 * (plain - 3.0);
        let g = &grads[model.biases.clone()];
        assert_eq!((g[1], g[6]), (dout, dout));
        assert_eq!(g.iter().filter(|&&x| x != 0.0).count(), 2);
    }

    /// The rows the model names for a batch are its ids, in order, each
    /// once, and exactly the table rows backward writes other than `+0.0`
    /// (with a gradient of 9 already in every row before it).
    #[test]
    fn the_sparse_rows_are_the_rows_backward_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        synth::write_ratings(&path, 2000, 40, 30, 2).unwrap();
        let index = Arc::new(RatingsIndex::build(&path).unwrap());
        let model = RecsysModel::new(&index, 3).unwrap();
        let b = Cpu::new(1).unwrap();
        let mut shard = RatingsShard::new(index, false);
        let order = Order::Shuffled {
            rank: 0,
            world_size: 1,
            seed: 5,
            resumed: None,
        };
        Batches::<Cpu, _>::start_epoch(&mut shard, &b, &order, 0, 64).unwrap();
        let mut buf = Model::<Cpu>::buffers(&model, &b, 64, true).unwrap();
        let params = b.upload(&Model::<Cpu>::init_params(&model, 3)).unwrap();
        for step in 0..3 {
            shard.fill(&b, step, &mut buf).unwrap();
            let mut want = buf.ids.clone();
            want.sort_unstable();
            want.dedup();
            let rows = RowTables::<RecsysBuffers<Cpu>>::rows(&model, &buf).to_vec();
            assert_eq!(rows, want);
            assert!(
                rows.len() > 40,
                "{} rows: the batch repeats ids",
                rows.len()
            );
            model.forward(&b, &mut buf, &params, Mode::Eval).unwrap();
            model.loss(&b, &mut buf, &mut vec![0.0]).unwrap();
            let mut grads = vec![9.0; params.len()];
            let mut hook = crate::model::NoSync;
            model
                .backward(
                    &b,
                    &mut buf,
                    &params,
                    &mut grads,
                    DropoutSeed::default(),
                    &mut hook,
                )
                .unwrap();
            let written: Vec<u32> = (grads[model.embedding.clone()].chunks(3).enumerate())
                .filter(|(_, row)| row.iter().any(|x| x.to_bits() != 0))
                .map(|(r, _)| r as u32)
                .collect();
            assert_eq!(written, rows, "step {step}");
        }
    }
}
