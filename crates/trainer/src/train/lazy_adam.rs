//! `--sparse-adam`: the embedding table ([`Model::sparse_table`]) gets
//! `torch.optim.SparseAdam`'s lazy update on the rows the step's batch
//! looked up (with several ranks, the union of all ranks' rows, which the
//! sparse gradient exchange forms), every other row keeping its parameters
//! and moments; the rest of the parameters get dense Adam. Nothing of the
//! optimizer's work per step grows with the table: dense Adam runs over
//! the parameters outside it, and the lazy step over the rows named.

use anyhow::{Context, bail};
use core_tensor::Ops;
use core_tensor::ops::{AdamConfig, RowsGeom};

use super::replica::Replica;
use crate::model::Model;

/// The table's place and the device ids of the rows to update.
pub(super) struct LazyAdam<B: Ops> {
    table: RowsGeom,
    /// Room for the most rows updated yet (powers of two, never past the
    /// table's rows).
    ids: Option<B::Storage<u32>>,
}

impl<B: Ops> LazyAdam<B> {
    /// The lazy update of `model`'s sparse table, or `None` without
    /// `sparse_adam`; an error for a model without one.
    pub fn plan<M: Model<B>>(model: &M, sparse_adam: bool) -> anyhow::Result<Option<Self>> {
        if !sparse_adam {
            return Ok(None);
        }
        let Some((range, dim)) = model.sparse_table() else {
            bail!(
                "--sparse-adam updates the rows of an embedding table a batch looked up, but \
                 --model {} has no such table; leave --sparse-adam out",
                model.kind()
            );
        };
        let dim = dim.max(1);
        Ok(Some(Self {
            table: RowsGeom {
                count: 0,
                dim,
                rows: range.len() / dim,
                offset: range.start,
            },
            ids: None,
        }))
    }

    /// One optimizer step of `replica`: update number `replica.step` of
    /// `adam`, the table's `rows` (increasing, each once) lazily.
    pub fn step(
        &mut self,
        backend: &B,
        adam: &AdamConfig,
        rows: &[u32],
        replica: &mut Replica<B>,
    ) -> anyhow::Result<()> {
        let r = replica;
        let dense = adam.scalars(r.step);
        let table = self.table.table();
        let len = B::len(&r.params);
        for range in [0..table.start, table.end..len] {
            backend.adam_step_range(
                &dense,
                range,
                &mut r.params,
                &r.grads,
                &mut r.adam_m,
                &mut r.adam_v,
                &r.guard,
            )?;
        }
        let geom = RowsGeom {
            count: rows.len(),
            ..self.table
        };
        let ids = self.room(backend, rows.len())?;
        backend.write_range(rows, ids, 0)?;
        let lazy = adam.sparse_scalars(r.step);
        backend.sparse_adam_step(
            &lazy,
            &geom,
            ids,
            &mut r.params,
            &r.grads,
            &mut r.adam_m,
            &mut r.adam_v,
            &r.guard,
        )?;
        Ok(())
    }

    /// The device ids, with room for at least `count`.
    fn room(&mut self, backend: &B, count: usize) -> anyhow::Result<&mut B::Storage<u32>> {
        if (self.ids.as_ref()).is_none_or(|ids| B::len(ids) < count) {
            self.ids = None;
            let room = count.next_power_of_two().min(self.table.rows).max(count);
            self.ids = Some(backend.zeros(room)?);
        }
        self.ids.as_mut().context("made above")
    }
}
