//! Row-sparse gradients (a model's [`Model::row_tables`]: every table
//! the batch's ids index, recsys' embedding and its per-row biases) over
//! the host communicator: each step, after the dense buckets, every rank
//! either sends only the rows its batch looked up ([`Model::sparse_rows`]:
//! the ids once, then each table's rows) to all ranks, or the tables go
//! through the dense all-reduce, whichever moves fewer bytes over the
//! tables together, decided alike on every rank from the all-reduced row
//! counts. The tables never travel in the dense buckets.
//!
//! On the row path only those rows cross between the device and the host:
//! a gather of the rank's rows of each table into compact scratch, and a
//! scatter of the averaged union of every rank's rows back. Backward wrote
//! `+0.0` to every other row of the tables (the lookups' backward zeroes
//! them), which is also their average, so they are left as they are; no
//! host work and no scratch grows with the tables.
//!
//! The rows are summed as the dense all-reduce would sum them: per row,
//! rank 0's row (zeros when it sent none) plus each next rank's, in rank
//! order, then multiplied by `1 / world`. Rows a rank leaves out are all
//! `+0.0`, exactly what it would have added densely, so at two ranks (where
//! the ring's `a + b` is `b + a`) the result is the dense one bit for bit.
//!
//! Either way the exchange can hand back the union of every rank's rows
//! (the rows `--sparse-adam` updates): the row path forms it anyway; the
//! dense path, asked for it, gathers the ranks' ids alone after the
//! all-reduce.
//!
//! [`Model::row_tables`]: crate::model::Model::row_tables
//! [`Model::sparse_rows`]: crate::model::Model::sparse_rows

#[cfg(test)]
mod tests;

use std::ops::Range;

use anyhow::{Context, bail, ensure};
use core_tensor::ops::{RowsGeom, RowsKernel};

use super::SparseGrads;
use crate::comm_thread::{CommHandle, CommThread, Op, Staged};
use crate::model::{row_room, row_table_geom};

/// Row indices travel as f32: exact below 2^24.
const MAX_ROWS: usize = 1 << 24;

/// The tables, the device scratch their rows pass through, and the handle
/// their exchanges go through.
pub struct SparseExchange<B: RowsKernel> {
    /// Every table's place (`count` 0), in the order their rows travel.
    tables: Vec<RowsGeom>,
    /// The tables' row widths summed: the values one id carries.
    width: usize,
    always: bool,
    /// Whether the dense path also forms the union of the ranks' rows.
    union: bool,
    comm: CommHandle,
    rank: usize,
    world: usize,
    /// The tables' host copy, for the dense all-reduce only.
    host: Vec<f32>,
    scratch: Option<Scratch<B>>,
    /// Whether the scratch's ids hold the union the last exchange returned.
    union_in_scratch: bool,
    steps: u64,
}

/// Row ids and each table's rows on the device, with room for the most
/// rows moved yet.
struct Scratch<B: RowsKernel> {
    ids: B::Storage<u32>,
    rows: Vec<B::Storage<f32>>,
}

impl<B: RowsKernel> SparseExchange<B> {
    /// The exchange for a model's row `tables` (range, row width; the same
    /// ids index every one, so they have as many rows), or `None` where the
    /// tables keep the dense buckets (`--sparse-grads never`, no table, one
    /// rank, or too many rows for `auto`). With `union`, every exchange
    /// returns the union of the ranks' rows, whichever path the gradients
    /// took.
    pub fn plan(
        tables: Vec<(Range<usize>, usize)>,
        mode: SparseGrads,
        comm: &CommThread,
        union: bool,
    ) -> anyhow::Result<Option<Self>> {
        let tables: Vec<RowsGeom> = (tables.iter())
            .map(|(range, width)| row_table_geom(range, *width))
            .collect();
        let Some(rows) = tables.first().map(|t| t.rows) else {
            return Ok(None);
        };
        if let Some(t) = tables.iter().find(|t| t.rows != rows) {
            bail!(
                "the model's row tables, indexed by the same ids, must have as many rows each, \
                 but one at element {} has {} rows where the first has {rows}: Model::row_tables \
                 must name only tables the batch's ids index",
                t.offset,
                t.rows
            );
        }
        if mode == SparseGrads::Never || comm.world_size() == 1 {
            return Ok(None);
        }
        if rows > MAX_ROWS {
            if mode == SparseGrads::Always {
                bail!(
                    "--sparse-grads always sends row indices as f32, exact only below {MAX_ROWS} \
                     rows, but the table has {rows}; use --sparse-grads auto or never"
                );
            }
            return Ok(None);
        }
        Ok(Some(Self {
            host: Vec::new(),
            width: tables.iter().map(|t| t.dim).sum(),
            tables,
            always: mode == SparseGrads::Always,
            union,
            comm: comm.handle(),
            rank: comm.rank(),
            world: comm.world_size(),
            scratch: None,
            union_in_scratch: false,
            steps: 0,
        }))
    }

    /// Whether every exchange returns the union of the ranks' rows.
    pub fn forms_union(&self) -> bool {
        self.union
    }

    /// The union the last exchange returned, on the device, where the row
    /// path left it (its scatter's ids; at least the union's length): the
    /// lazy update reads it there instead of uploading it again. `None`
    /// after the dense path or an empty union.
    pub fn union_on_device(&self) -> Option<&B::Storage<u32>> {
        let scratch = self.scratch.as_ref().filter(|_| self.union_in_scratch);
        scratch.map(|s| &s.ids)
    }

    /// `buckets` without the elements of `sparse`'s tables, launch order
    /// kept (a bucket a table splits becomes its upper, then lower part).
    pub fn dense_buckets(
        sparse: Option<&SparseExchange<B>>,
        buckets: Vec<Range<usize>>,
    ) -> Vec<Range<usize>> {
        let tables = sparse.map_or(&[][..], |s| &s.tables);
        (tables.iter()).fold(buckets, |buckets, t| without(&t.table(), buckets))
    }

    /// Averages the tables' gradients in `grads` over all ranks; `rows`
    /// are the rows this rank's batch looked up, increasing (the model's
    /// [`crate::model::Model::sparse_rows`]). Returns the union of every
    /// rank's rows, increasing, when the row path formed it or the plan
    /// asked for it.
    pub fn exchange(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        rows: Option<&[u32]>,
    ) -> anyhow::Result<Option<Vec<u32>>> {
        let rows = rows.context(
            "the model declares row-sparse gradient tables but not the rows its batch looked up",
        )?;
        let (w, world) = (self.width, self.world);
        let mut counts = vec![0.0; world];
        counts[self.rank] = rows.len() as f64;
        let sent: f64 = self.comm.sum_f64(counts)?.iter().sum();
        // Each rank's rows cross world - 1 links (ring broadcast); the ring
        // all-reduce sends twice the tables over the same links.
        let elements: usize = self.tables.iter().map(|t| t.rows * t.dim).sum();
        let (sparse_bytes, dense_bytes) = (
            (world - 1) as u64 * sent as u64 * (1 + w) as u64 * 4,
            (world - 1) as u64 * 2 * elements as u64 * 4,
        );
        let use_sparse = self.always || sparse_bytes < dense_bytes;
        self.steps += 1;
        self.union_in_scratch = false;
        if self.rank == 0 && self.steps == 1 {
            tell!(
                "rank 0: sparse gradients, first step: {sent} touched rows in all, {sparse_bytes} B \
                 as rows vs {dense_bytes} B dense (bytes sent by all ranks): {}",
                if use_sparse { "rows" } else { "dense" }
            );
        }
        if use_sparse {
            return self.sum_rows(backend, grads, rows).map(Some);
        }
        self.host.resize(elements, 0.0);
        let mut at = 0;
        for t in &self.tables {
            let part = &mut self.host[at..at + t.rows * t.dim];
            backend.read_range(grads, t.table(), part)?;
            at += part.len();
        }
        let staged: Staged = Box::new(std::mem::take(&mut self.host));
        self.comm.submit(Op::AverageF32(staged, None))?;
        self.host = self.comm.next_staged()?.to_vec();
        let mut at = 0;
        for t in &self.tables {
            let part = &self.host[at..at + t.rows * t.dim];
            backend.write_range(part, grads, t.offset)?;
            at += part.len();
        }
        if !self.union {
            return Ok(None);
        }
        let gathered = self
            .comm
            .all_gather(rows.iter().map(|&r| r as f32).collect())?;
        let parsed = (gathered.iter().enumerate())
            .map(|(from, data)| self.parse(from, data, 0))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Some(union(&parsed)))
    }

    /// Sends `mine` rows of every table to every rank and writes the
    /// average of every rank's rows into the union of the rows sent, which
    /// it returns.
    fn sum_rows(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        mine: &[u32],
    ) -> anyhow::Result<Vec<u32>> {
        let (w, k) = (self.width, mine.len());
        // The ids, then each table's k rows.
        let mut payload: Vec<f32> = mine.iter().map(|&r| r as f32).collect();
        payload.resize(k * (1 + w), 0.0);
        if k > 0 {
            let s = Self::scratch(&mut self.scratch, &self.tables, backend, k)?;
            backend.write_range(mine, &mut s.ids, 0)?;
            let mut at = k;
            for (t, rows) in self.tables.iter().zip(&mut s.rows) {
                let geom = RowsGeom { count: k, ..*t };
                backend.rows_gather(&geom, &s.ids, grads, rows)?;
                backend.read_range(rows, 0..k * t.dim, &mut payload[at..at + k * t.dim])?;
                at += k * t.dim;
            }
        }
        let gathered = self.comm.all_gather(payload)?;
        let parsed = (gathered.iter().enumerate())
            .map(|(from, data)| self.parse(from, data, w))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let union = union(&parsed);
        if union.is_empty() {
            return Ok(union);
        }
        let s = Self::scratch(&mut self.scratch, &self.tables, backend, union.len())?;
        backend.write_range(&union, &mut s.ids, 0)?;
        let mut before = 0;
        for (t, rows) in self.tables.iter().zip(&mut s.rows) {
            let sum = average(&parsed, &union, before, t.dim);
            before += t.dim;
            backend.write_range(&sum, rows, 0)?;
            let geom = RowsGeom {
                count: union.len(),
                ..*t
            };
            backend.rows_scatter(&geom, &s.ids, rows, grads)?;
        }
        self.union_in_scratch = true;
        Ok(union)
    }

    /// Rank `from`'s rows of `w` values: their ids (below the tables' rows,
    /// increasing) and their values (each table's rows in turn).
    fn parse<'a>(
        &self,
        from: usize,
        data: &'a [f32],
        w: usize,
    ) -> anyhow::Result<(Vec<u32>, &'a [f32])> {
        let rows = self.tables.first().map_or(0, |t| t.rows);
        let k = data.len() / (1 + w);
        ensure!(
            data.len() == k * (1 + w),
            "rank {from} sent {} sparse gradient values, not rows of 1 + {w}",
            data.len()
        );
        let (ids, values) = data.split_at(k);
        let mut last = None;
        let ids = (ids.iter())
            .map(|&id| {
                let row = id as u32;
                let ok = id == row as f32 && (row as usize) < rows && last.is_none_or(|l| l < row);
                last = Some(row);
                ok.then_some(row)
                    .with_context(|| format!("rank {from} sent a bad sparse gradient row {id}"))
            })
            .collect::<anyhow::Result<Vec<u32>>>()?;
        Ok((ids, values))
    }

    /// The device scratch `slot`, with room for at least `count` ids and
    /// rows of each of `tables` ([`row_room`]).
    fn scratch<'a>(
        slot: &'a mut Option<Scratch<B>>,
        tables: &[RowsGeom],
        backend: &B,
        count: usize,
    ) -> anyhow::Result<&'a mut Scratch<B>> {
        if (slot.as_ref()).is_none_or(|s| B::len(&s.ids) < count) {
            *slot = None;
            let most = tables.first().map_or(0, |t| t.rows);
            let room = row_room(count, most);
            *slot = Some(Scratch {
                ids: backend.zeros(room)?,
                rows: (tables.iter())
                    .map(|t| backend.zeros(room * t.dim))
                    .collect::<core_tensor::Result<_>>()?,
            });
        }
        slot.as_mut().context("made above")
    }
}

/// The average over the ranks of one table's rows in `union` (rows of
/// `dim`, each rank's `k` rows starting at value `k · before` of what it
/// sent), summed as the dense all-reduce sums: in rank order, a rank that
/// sent no such row adding `+0.0`, then scaled by `1 / world`.
fn average(parsed: &[(Vec<u32>, &[f32])], union: &[u32], before: usize, dim: usize) -> Vec<f32> {
    let mut sum = vec![0.0f32; union.len() * dim];
    for (from, (ids, values)) in parsed.iter().enumerate() {
        let k = ids.len();
        let rows = &values[k * before..k * (before + dim)];
        // Every rank's ids increase: one pass along the union finds them.
        let mut sent = ids.iter().zip(rows.chunks_exact(dim)).peekable();
        for (&r, out) in union.iter().zip(sum.chunks_exact_mut(dim)) {
            match (sent.next_if(|(id, _)| **id == r), from) {
                (None, 0) => out.fill(0.0),
                (None, _) => out.iter_mut().for_each(|o| *o += 0.0),
                (Some((_, row)), 0) => out.copy_from_slice(row),
                (Some((_, row)), _) => out.iter_mut().zip(row).for_each(|(o, v)| *o += v),
            }
        }
    }
    let scale = 1.0 / parsed.len() as f32;
    sum.iter_mut().for_each(|x| *x *= scale);
    sum
}

/// The ids of every rank's rows, increasing, each once.
fn union(parsed: &[(Vec<u32>, &[f32])]) -> Vec<u32> {
    let mut union: Vec<u32> = (parsed.iter())
        .flat_map(|(ids, _)| ids.iter().copied())
        .collect();
    union.sort_unstable();
    union.dedup();
    union
}

/// `buckets` less the elements of `table`, in the same order.
fn without(table: &Range<usize>, buckets: Vec<Range<usize>>) -> Vec<Range<usize>> {
    buckets
        .into_iter()
        .flat_map(|b| {
            [
                table.end.max(b.start)..b.end,
                b.start..table.start.min(b.end),
            ]
        })
        .filter(|b| !b.is_empty())
        .collect()
}
