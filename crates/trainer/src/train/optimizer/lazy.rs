//! `--sparse-adam`: the tables the batch's ids index ([`Model::row_tables`]:
//! recsys' embedding and its per-row biases) get `torch.optim.SparseAdam`'s
//! lazy update on the rows the step's batch looked up (with several ranks,
//! the union of all ranks' rows, which the sparse gradient exchange forms),
//! every other row keeping its parameters and moments; the rest of the
//! parameters get dense Adam. Nothing of the optimizer's work per step grows
//! with the tables: the finiteness guard reads the loss, the gradients
//! outside the tables and the rows named; dense Adam runs over the
//! parameters outside the tables, and the lazy step over the rows named,
//! which it then zeroes in the gradient, so that the tables' gradients are
//! all zero whenever backward begins and backward need not zero them
//! ([`RowTables::adds_into_zeroed_tables`]).
//!
//! [`RowTables::adds_into_zeroed_tables`]: crate::model::RowTables::adds_into_zeroed_tables

use std::ops::Range;

use anyhow::{Context, bail};
use core_tensor::Ops;
use core_tensor::ops::{AdamConfig, RowsGeom};

use super::{Optimizer, StepRows, no_rows, refuse_kind};
use crate::ddp::Averaging;
use crate::model::{Model, row_room, row_table_geom};
use crate::train::TrainConfig;
use crate::train::replica::Replica;

/// The tables' places, the dense ranges between them, and device room for
/// the rows to update.
pub(super) struct LazyAdam<B: Ops> {
    adam: AdamConfig,
    /// Every table the rows index (`count` 0), in flat order.
    tables: Vec<RowsGeom>,
    /// The parameters outside every table, in flat order.
    dense: Vec<Range<usize>>,
    room: Option<Room<B>>,
}

/// The ids of the rows to update, and zero rows to write into their
/// gradient afterwards: room for the most rows updated yet (powers of two,
/// never past the tables' rows) of the widest table.
struct Room<B: Ops> {
    ids: B::Storage<u32>,
    zeros: B::Storage<f32>,
}

impl<B: Ops> LazyAdam<B> {
    /// The lazy update of `model`'s row tables; an error for a model
    /// without any, and for more than one of `replicas` where `averaging`
    /// hands back no union of their rows.
    pub fn plan<M: Model<B>>(
        model: &M,
        cfg: &TrainConfig,
        averaging: &Averaging<B>,
        replicas: usize,
    ) -> anyhow::Result<Self> {
        if replicas > 1 && !averaging.forms_row_union() {
            bail!(
                "--sparse-adam updates the union of the ranks' batch rows, which the host's \
                 sparse gradient exchange forms; this job averages the table densely \
                 (--backend nccl, --sparse-grads never, or a table of 2^24 rows or more): use \
                 --backend tcp and --sparse-grads auto or always, or leave --sparse-adam out"
            );
        }
        let Some(row_tables) = model.row_tables() else {
            bail!(
                "--sparse-adam updates the rows of an embedding table a batch looked up, but \
                 --model {} has no such table; leave --sparse-adam out",
                model.kind()
            );
        };
        refuse_kind(model.optimizer(), model.kind())?;
        if !row_tables.adds_into_zeroed_tables() {
            bail!(
                "--model {}: its backward overwrites its tables' gradients, which the lazy step's zeroed rows would not keep: build it keeping them zero",
                model.kind()
            );
        }
        let mut tables = row_tables.tables();
        tables.sort_by_key(|(range, _)| range.start);
        let mut dense = Vec::new();
        let mut at = 0;
        for (range, _) in &tables {
            if range.start < at {
                bail!("--model {}: its row tables overlap", model.kind());
            }
            dense.push(at..range.start);
            at = range.end;
        }
        dense.push(at..model.layout().len());
        dense.retain(|range| !range.is_empty());
        if dense.is_empty() {
            // The guard reads the loss with the dense ranges: one, empty.
            dense.push(0..0);
        }
        let tables = (tables.iter())
            .map(|(range, width)| row_table_geom(range, *width))
            .collect();
        Ok(Self {
            adam: cfg.adam,
            tables,
            dense,
            room: None,
        })
    }

    /// The device buffers `room`, with room for at least `count` rows of
    /// any of `tables`.
    fn room<'a>(
        room: &'a mut Option<Room<B>>,
        tables: &[RowsGeom],
        backend: &B,
        count: usize,
    ) -> anyhow::Result<&'a mut Room<B>> {
        if (room.as_ref()).is_none_or(|room| B::len(&room.ids) < count) {
            *room = None;
            let most = tables.iter().map(|t| t.rows).max().unwrap_or(0);
            let dim = tables.iter().map(|t| t.dim).max().unwrap_or(1);
            let rows = row_room(count, most);
            *room = Some(Room {
                ids: backend.zeros(rows)?,
                zeros: backend.zeros(rows * dim)?,
            });
        }
        room.as_mut().context("made above")
    }
}

impl<B: Ops> Optimizer<B> for LazyAdam<B> {
    /// Update number `replica.step`, the tables' `rows` (increasing, each
    /// once) lazily, behind the guard, which first reads `loss` (one
    /// value) and every gradient the update reads; then those rows of the
    /// gradient are zero again. `rows.on_device` holds the ids on the
    /// device already (the sparse exchange's), else they are uploaded.
    fn step(
        &mut self,
        backend: &B,
        replica: &mut Replica<B>,
        loss: &B::Storage<f32>,
        rows: StepRows<'_, B>,
    ) -> anyhow::Result<()> {
        let (rows, on_device) = (rows.ids.ok_or_else(no_rows)?, rows.on_device);
        let adam = &self.adam;
        let r = replica;
        let step = r.guard_step();
        let room = Self::room(&mut self.room, &self.tables, backend, rows.len())?;
        let ids = match on_device {
            Some(ids) => ids,
            None => {
                backend.write_range(rows, &mut room.ids, 0)?;
                &room.ids
            }
        };
        let used = |table: &RowsGeom| RowsGeom {
            count: rows.len(),
            ..*table
        };
        // Every check before any update, since the updates skip on what
        // the guard says. The dense ranges and the tables interleave in
        // flat order: the guard keeps the smallest bad index of all its
        // calls, whatever their order.
        for range in &self.dense {
            backend.guard_finite_range(step, loss, &r.grads, range.clone(), &mut r.guard)?;
        }
        for table in &self.tables {
            backend.guard_finite_rows(step, &used(table), ids, &r.grads, &mut r.guard)?;
        }
        let dense = adam.scalars(r.step);
        for range in &self.dense {
            backend.adam_step_range(
                &dense,
                range.clone(),
                &mut r.params,
                &r.grads,
                &mut r.adam_m,
                &mut r.adam_v,
                &r.guard,
            )?;
        }
        let lazy = adam.sparse_scalars(r.step);
        for table in &self.tables {
            let geom = used(table);
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
            backend.rows_scatter(&geom, ids, &room.zeros, &mut r.grads)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use core_tensor::ops::{AdamKernel, GUARD_CLEAR, GuardState};
    use core_tensor::{Backend, Cpu};

    use super::*;
    use crate::checkpoint::Position;
    use crate::checkpoint::origin::Start;
    use crate::model::RowTables;
    use crate::models::recsys::{RatingsIndex, RecsysBuffers, RecsysModel, synth};

    /// recsys' row tables: the embedding, then the biases.
    fn tables_of(model: &RecsysModel) -> Vec<(Range<usize>, usize)> {
        RowTables::<RecsysBuffers<Cpu>>::tables(model)
    }

    /// Rows 1 and 4 of recsys' tables (rows of 3, and the biases), as a
    /// step's batch names them.
    const NAMED: [u32; 2] = [1, 4];

    /// A recsys model with rows of 3, a starting point of `n` parameters,
    /// and a gradient that is zero in its tables but for the rows named.
    fn fixture() -> (RecsysModel, Start, Vec<f32>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        synth::write_ratings(&path, 200, 5, 7, 1).unwrap();
        let model = RecsysModel::new(&RatingsIndex::build(&path).unwrap(), 3).unwrap();
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
            epoch_visited: (0, 1),
            hook: None,
            broadcast_bytes: 0,
        };
        let mut grads = wave(0.5);
        for (i, g) in grads.iter_mut().enumerate() {
            if table_of(&model, i).is_some() && !named(&model, i) {
                *g = 0.0;
            }
        }
        (model, start, grads)
    }

    /// The row table element `i` lies in, and its row width.
    fn table_of(model: &RecsysModel, i: usize) -> Option<(Range<usize>, usize)> {
        let tables = tables_of(model);
        tables.into_iter().find(|(range, _)| range.contains(&i))
    }

    /// Whether element `i` lies in a named row of a table.
    fn named(model: &RecsysModel, i: usize) -> bool {
        table_of(model, i)
            .is_some_and(|(range, dim)| NAMED.contains(&(((i - range.start) / dim) as u32)))
    }

    /// Update 5 of the lazy step from `start` with `grads`: the replica.
    fn lazy_step(model: &RecsysModel, start: &Start, grads: &[f32]) -> Replica<Cpu> {
        let b = Cpu::new(1).unwrap();
        let mut replica = Replica::upload(&b, start, None).unwrap();
        replica.grads = b.upload(grads).unwrap();
        replica.step = 5;
        let model = model.clone().with_tables_kept_zero(true);
        let cfg = TrainConfig {
            sparse_adam: true,
            ..TrainConfig::new(1, 8)
        };
        let mut lazy = LazyAdam::plan(&model, &cfg, &Averaging::alone(), 1).unwrap();
        let rows = StepRows {
            ids: Some(&NAMED),
            on_device: None,
        };
        lazy.step(&b, &mut replica, &vec![0.5], rows).unwrap();
        replica
    }

    /// A step over rows 1 and 4: the MLP as dense Adam steps it, those rows
    /// of the table and of the biases as the lazy kernel steps them, every
    /// other row's parameters and moments as they were, and the tables'
    /// gradients all zero afterwards (what backward then relies on).
    #[test]
    fn a_step_moves_the_dense_part_and_the_rows_named_and_zeroes_their_gradient() {
        let (model, start, grads) = fixture();
        let replica = lazy_step(&model, &start, &grads);
        let (b, adam, clear) = (Cpu::new(1).unwrap(), AdamConfig::default(), GUARD_CLEAR);
        let (mut p, mut m, mut v) = (
            start.params.clone(),
            start.exp_avg.clone(),
            start.exp_avg_sq.clone(),
        );
        b.adam_step(
            &adam.scalars(5),
            &mut p,
            &grads,
            &mut m,
            &mut v,
            &clear.to_vec(),
        )
        .unwrap();
        let (mut lp, mut lm, mut lv) = (
            start.params.clone(),
            start.exp_avg.clone(),
            start.exp_avg_sq.clone(),
        );
        for (table, dim) in tables_of(&model) {
            let rows = RowsGeom {
                count: NAMED.len(),
                dim,
                rows: table.len() / dim,
                offset: table.start,
            };
            let (s, ids) = (adam.sparse_scalars(5), NAMED.to_vec());
            (b.sparse_adam_step(
                &s,
                &rows,
                &ids,
                &mut lp,
                &grads,
                &mut lm,
                &mut lv,
                &clear.to_vec(),
            ))
            .unwrap();
        }
        for i in 0..grads.len() {
            let got = [replica.params[i], replica.adam_m[i], replica.adam_v[i]];
            let want = match (table_of(&model, i).is_some(), named(&model, i)) {
                (false, _) => [p[i], m[i], v[i]],
                (true, true) => [lp[i], lm[i], lv[i]],
                (true, false) => [start.params[i], start.exp_avg[i], start.exp_avg_sq[i]],
            };
            assert_eq!(got.map(f32::to_bits), want.map(f32::to_bits), "element {i}");
            match table_of(&model, i) {
                Some(_) => assert_eq!(replica.grads[i].to_bits(), 0, "gradient {i}"),
                None => assert_eq!(replica.grads[i], grads[i], "gradient {i}"),
            }
        }
        let moved = |i: &usize| replica.params[*i] != start.params[*i];
        let named_elements: Vec<usize> = (0..grads.len()).filter(|&i| named(&model, i)).collect();
        assert_eq!(named_elements.len(), 2 * (3 + 1));
        assert!(named_elements.iter().all(moved));
    }

    /// A NaN the update would read trips the guard at the step with its
    /// flat index, the smallest of several, and nothing moves; one in a
    /// row the step did not name is not read.
    #[test]
    fn the_guard_reads_the_dense_gradients_and_the_rows_named() {
        let (model, start, grads) = fixture();
        let (table, _) = tables_of(&model)[0].clone();
        let biases = Model::<Cpu>::layout(&model).range("bias.weight").unwrap();
        let mlp = biases.end + 7;
        let (table_row, bias_row) = (table.start + 3 * 4 + 2, biases.start + 1);
        for (bad, want) in [
            (vec![mlp], Some(mlp)),
            (vec![table_row], Some(table_row)),
            (vec![bias_row], Some(bias_row)),
            (vec![mlp, bias_row, table_row], Some(table_row)),
            (vec![table.start + 3 * 2, biases.start + 3], None),
        ] {
            let mut grads = grads.clone();
            bad.iter().for_each(|&i| grads[i] = f32::NAN);
            let replica = lazy_step(&model, &start, &grads);
            let guard = GuardState::from_words([replica.guard[0], replica.guard[1]]);
            match want {
                Some(index) => {
                    let tripped = GuardState::Tripped {
                        step: 5,
                        index: Some(index),
                    };
                    assert_eq!(guard, tripped, "NaN at {bad:?}");
                    assert_eq!(replica.params, start.params, "NaN at {bad:?}");
                }
                None => assert_eq!(guard, GuardState::Clear, "NaN at {bad:?}"),
            }
        }
    }
}
