//! `--sparse-adam`: the embedding table ([`Model::sparse_table`]) gets
//! `torch.optim.SparseAdam`'s lazy update on the rows the step's batch
//! looked up (with several ranks, the union of all ranks' rows, which the
//! sparse gradient exchange forms), every other row keeping its parameters
//! and moments; the rest of the parameters get dense Adam. Nothing of the
//! optimizer's work per step grows with the table: dense Adam runs over
//! the parameters outside it, and the lazy step over the rows named, which
//! it then zeroes in the gradient, so that the table's gradient is all
//! zero whenever backward begins and backward need not zero the whole
//! table ([`Model::sparse_table_kept_zero`]).

use anyhow::{Context, bail};
use core_tensor::Ops;
use core_tensor::ops::{AdamConfig, RowsGeom};

use super::replica::Replica;
use crate::ddp::Reducer;
use crate::model::Model;

/// The table's place, and device room for the rows to update.
pub(super) struct LazyAdam<B: Ops> {
    table: RowsGeom,
    room: Option<Room<B>>,
}

/// The ids of the rows to update, and zero rows to write into their
/// gradient afterwards: room for the most rows updated yet (powers of two,
/// never past the table's rows).
struct Room<B: Ops> {
    ids: B::Storage<u32>,
    zeros: B::Storage<f32>,
}

impl<B: Ops> LazyAdam<B> {
    /// The lazy update of `model`'s sparse table, or `None` without
    /// `sparse_adam`; an error for a model without one, or for more than
    /// one of `world` ranks where `reducer` hands back no union of their
    /// rows. Tells `model` that its table's gradient is kept zero.
    pub fn plan<M: Model<B>>(
        model: &mut M,
        sparse_adam: bool,
        reducer: Option<&Reducer<B>>,
        world: usize,
    ) -> anyhow::Result<Option<Self>> {
        if !sparse_adam {
            return Ok(None);
        }
        if world > 1 && !reducer.is_some_and(|r| r.forms_row_union()) {
            bail!(
                "--sparse-adam updates the union of the ranks' batch rows, which the host's \
                 sparse gradient exchange forms; this job averages the table densely \
                 (--backend nccl, --sparse-grads never, or a table of 2^24 rows or more): use \
                 --backend tcp and --sparse-grads auto or always, or leave --sparse-adam out"
            );
        }
        let Some((range, dim)) = model.sparse_table() else {
            bail!(
                "--sparse-adam updates the rows of an embedding table a batch looked up, but \
                 --model {} has no such table; leave --sparse-adam out",
                model.kind()
            );
        };
        let dim = dim.max(1);
        // The lazy step zeroes the table's gradient rows it used.
        model.sparse_table_kept_zero();
        Ok(Some(Self {
            table: RowsGeom {
                count: 0,
                dim,
                rows: range.len() / dim,
                offset: range.start,
            },
            room: None,
        }))
    }

    /// One optimizer step of `replica`: update number `replica.step` of
    /// `adam`, the table's `rows` (increasing, each once) lazily; then
    /// those rows of the gradient are zero again.
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
        let room = self.room(backend, rows.len())?;
        backend.write_range(rows, &mut room.ids, 0)?;
        backend.sparse_adam_step(
            &adam.sparse_scalars(r.step),
            &geom,
            &room.ids,
            &mut r.params,
            &r.grads,
            &mut r.adam_m,
            &mut r.adam_v,
            &r.guard,
        )?;
        backend.rows_scatter(&geom, &room.ids, &room.zeros, &mut r.grads)?;
        Ok(())
    }

    /// The device buffers, with room for at least `count` rows.
    fn room(&mut self, backend: &B, count: usize) -> anyhow::Result<&mut Room<B>> {
        if (self.room.as_ref()).is_none_or(|room| B::len(&room.ids) < count) {
            self.room = None;
            let rows = count.next_power_of_two().min(self.table.rows).max(count);
            self.room = Some(Room {
                ids: backend.zeros(rows)?,
                zeros: backend.zeros(rows * self.table.dim)?,
            });
        }
        self.room.as_mut().context("made above")
    }
}

#[cfg(test)]
mod tests {
    use core_tensor::ops::{AdamKernel, GUARD_CLEAR};
    use core_tensor::{Backend, Cpu};

    use super::*;
    use crate::checkpoint::Position;
    use crate::checkpoint::origin::Start;
    use crate::model::recsys::{RatingsIndex, RecsysModel, synth};

    /// A step over rows 1 and 4 of a table of rows of 3: the dense part as
    /// dense Adam steps it, those rows as the lazy kernel steps them, every
    /// other row's parameters and moments as they were, and the table's
    /// gradient all zero afterwards (what backward then relies on).
    #[test]
    fn a_step_moves_the_dense_part_and_the_rows_named_and_zeroes_their_gradient() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        synth::write_ratings(&path, 200, 5, 7, 1).unwrap();
        let model = RecsysModel::new(&RatingsIndex::build(&path).unwrap(), 3).unwrap();
        let (table, _) = Model::<Cpu>::sparse_table(&model).unwrap();
        let b = Cpu::new(1).unwrap();
        let n = Model::<Cpu>::layout(&model).len();
        let wave = |a: f32| (0..n).map(|i| (a * i as f32).sin()).collect::<Vec<f32>>();
        let start = Start {
            params: wave(0.3),
            exp_avg: wave(0.7),
            exp_avg_sq: wave(0.9).iter().map(|x| x * x).collect(),
            optimizer_step: 4,
            position: Position { epoch: 1, step: 4 },
            epoch_loss_sum: 0.0,
            epoch_correct: 0.0,
            epoch_train_seconds: 0.0,
        };
        let mut grads = wave(0.5);
        let named = [1usize, 4].map(|r| table.start + 3 * r..table.start + 3 * r + 3);
        for (i, g) in grads[table.clone()].iter_mut().enumerate() {
            if !named.iter().any(|r| r.contains(&(table.start + i))) {
                *g = 0.0;
            }
        }
        let mut replica = Replica::upload(&b, &start, None).unwrap();
        replica.grads = b.upload(&grads).unwrap();
        replica.step = 5;
        let adam = AdamConfig::default();
        let mut lazy = LazyAdam::plan(&mut model.clone(), true, None, 1)
            .unwrap()
            .unwrap();
        lazy.step(&b, &adam, &[1, 4], &mut replica).unwrap();

        let (mut p, mut m, mut v) = (
            start.params.clone(),
            start.exp_avg.clone(),
            start.exp_avg_sq.clone(),
        );
        let clear = GUARD_CLEAR.to_vec();
        b.adam_step(&adam.scalars(5), &mut p, &grads, &mut m, &mut v, &clear)
            .unwrap();
        let (mut lp, mut lm, mut lv) = (
            start.params.clone(),
            start.exp_avg.clone(),
            start.exp_avg_sq.clone(),
        );
        let rows = RowsGeom {
            count: 2,
            dim: 3,
            rows: table.len() / 3,
            offset: table.start,
        };
        b.sparse_adam_step(
            &adam.sparse_scalars(5),
            &rows,
            &vec![1, 4],
            &mut lp,
            &grads,
            &mut lm,
            &mut lv,
            &clear,
        )
        .unwrap();
        for i in 0..n {
            let got = [replica.params[i], replica.adam_m[i], replica.adam_v[i]];
            let want = match (table.contains(&i), named.iter().any(|r| r.contains(&i))) {
                (false, _) => [p[i], m[i], v[i]],
                (true, true) => [lp[i], lm[i], lv[i]],
                (true, false) => [start.params[i], start.exp_avg[i], start.exp_avg_sq[i]],
            };
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "element {i}");
        }
        assert!(
            named
                .iter()
                .all(|r| r.clone().all(|i| replica.params[i] != start.params[i]))
        );
        assert!(
            replica.grads[table.clone()]
                .iter()
                .all(|g| g.to_bits() == 0)
        );
        assert_eq!(replica.grads[table.end..], grads[table.end..]);
    }
}
