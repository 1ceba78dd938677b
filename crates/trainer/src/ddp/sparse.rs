//! Row-sparse gradients (a model's [`Model::sparse_table`]) over the host
//! communicator: each step, after the dense buckets, every rank either
//! sends only the rows its batch looked up ([`Model::sparse_rows`]: indices
//! and rows) to all ranks, or the table goes through the dense all-reduce,
//! whichever moves fewer bytes, decided alike on every rank from the
//! all-reduced row counts.
//!
//! On the row path only those rows cross between the device and the host:
//! a gather of the rank's rows into compact scratch, and a scatter of the
//! averaged union of every rank's rows back. Backward wrote `+0.0` to every
//! other row of the table (the embedding's backward zeroes it), which is
//! also their average, so they are left as they are; no host work and no
//! scratch grows with the table.
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
//! [`Model::sparse_table`]: crate::model::Model::sparse_table
//! [`Model::sparse_rows`]: crate::model::Model::sparse_rows

#[cfg(test)]
mod tests;

use std::ops::Range;

use anyhow::{Context, bail, ensure};
use core_tensor::ops::{RowsGeom, RowsKernel};

use super::comm_thread::{CommHandle, CommThread, Op, Staged};
use crate::cli::SparseGrads;

/// Row indices travel as f32: exact below 2^24.
const MAX_ROWS: usize = 1 << 24;

/// The table, the device scratch its rows pass through, and the handle its
/// exchanges go through.
pub struct SparseExchange<B: RowsKernel> {
    table: Range<usize>,
    width: usize,
    always: bool,
    /// Whether the dense path also forms the union of the ranks' rows.
    union: bool,
    comm: CommHandle,
    rank: usize,
    world: usize,
    /// The table's host copy, for the dense all-reduce only.
    host: Vec<f32>,
    scratch: Option<Scratch<B>>,
    steps: u64,
}

/// Row ids and rows on the device, with room for the most rows moved yet.
struct Scratch<B: RowsKernel> {
    ids: B::Storage<u32>,
    rows: B::Storage<f32>,
}

impl<B: RowsKernel> SparseExchange<B> {
    /// The exchange for a model's `table` (range, row width), or `None`
    /// where the table keeps the dense buckets (`--sparse-grads never`, no
    /// table, one rank, or too many rows for `auto`). With `union`, every
    /// exchange returns the union of the ranks' rows, whichever path the
    /// gradients took.
    pub fn plan(
        table: Option<(Range<usize>, usize)>,
        mode: SparseGrads,
        comm: &CommThread,
        union: bool,
    ) -> anyhow::Result<Option<Self>> {
        let Some((table, width)) = table else {
            return Ok(None);
        };
        let rows = table.len() / width.max(1);
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
            table,
            width: width.max(1),
            always: mode == SparseGrads::Always,
            union,
            comm: comm.handle(),
            rank: comm.rank(),
            world: comm.world_size(),
            scratch: None,
            steps: 0,
        }))
    }

    /// Whether every exchange returns the union of the ranks' rows.
    pub fn forms_union(&self) -> bool {
        self.union
    }

    /// `buckets` without the elements of `sparse`'s table, launch order
    /// kept (a bucket the table splits becomes its upper, then lower part).
    pub fn dense_buckets(
        sparse: Option<&SparseExchange<B>>,
        buckets: Vec<Range<usize>>,
    ) -> Vec<Range<usize>> {
        match sparse {
            Some(sparse) => without(&sparse.table, buckets),
            None => buckets,
        }
    }

    /// Averages the table's gradients in `grads` over all ranks; `rows` are
    /// the table rows this rank's batch looked up, increasing (the model's
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
            "the model declares a row-sparse gradient table but not the rows its batch looked up",
        )?;
        let (w, world) = (self.width, self.world);
        let mut counts = vec![0.0; world];
        counts[self.rank] = rows.len() as f64;
        let sent: f64 = self.comm.sum_f64(counts)?.iter().sum();
        // Each rank's rows cross world - 1 links (ring broadcast); the ring
        // all-reduce sends twice the table over the same links.
        let (sparse_bytes, dense_bytes) = (
            (world - 1) as u64 * sent as u64 * (1 + w) as u64 * 4,
            (world - 1) as u64 * 2 * self.table.len() as u64 * 4,
        );
        let use_sparse = self.always || sparse_bytes < dense_bytes;
        self.steps += 1;
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
        self.host.resize(self.table.len(), 0.0);
        backend.read_range(grads, self.table.clone(), &mut self.host)?;
        let staged: Staged = Box::new(std::mem::take(&mut self.host));
        self.comm.submit(Op::AverageF32(staged))?;
        self.host = self.comm.next_staged()?.to_vec();
        backend.write_range(&self.host, grads, self.table.start)?;
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

    /// Sends `mine` rows to every rank and writes the average of every
    /// rank's rows into the union of the rows sent, which it returns.
    fn sum_rows(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        mine: &[u32],
    ) -> anyhow::Result<Vec<u32>> {
        let (w, k) = (self.width, mine.len());
        let mut payload: Vec<f32> = mine.iter().map(|&r| r as f32).collect();
        payload.resize(k * (1 + w), 0.0);
        if k > 0 {
            let geom = self.geom(k);
            let s = self.scratch(backend, k)?;
            backend.write_range(mine, &mut s.ids, 0)?;
            backend.rows_gather(&geom, &s.ids, grads, &mut s.rows)?;
            backend.read_range(&s.rows, 0..k * w, &mut payload[k..])?;
        }
        let gathered = self.comm.all_gather(payload)?;
        let parsed = (gathered.iter().enumerate())
            .map(|(from, data)| self.parse(from, data, w))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let union = union(&parsed);
        // Each union row is summed in rank order; a rank that sent no such
        // row adds `+0.0`, as it would in the dense sum. Every rank's ids
        // increase, so one pass along the union finds its rows.
        let mut sum = vec![0.0f32; union.len() * w];
        for (from, (ids, values)) in parsed.iter().enumerate() {
            let mut sent = ids.iter().zip(values.chunks_exact(w)).peekable();
            for (&r, out) in union.iter().zip(sum.chunks_exact_mut(w)) {
                match (sent.next_if(|(id, _)| **id == r), from) {
                    (None, 0) => out.fill(0.0),
                    (None, _) => out.iter_mut().for_each(|o| *o += 0.0),
                    (Some((_, row)), 0) => out.copy_from_slice(row),
                    (Some((_, row)), _) => out.iter_mut().zip(row).for_each(|(o, v)| *o += v),
                }
            }
        }
        let scale = 1.0 / self.world as f32;
        sum.iter_mut().for_each(|x| *x *= scale);
        if !union.is_empty() {
            let geom = self.geom(union.len());
            let s = self.scratch(backend, union.len())?;
            backend.write_range(&union, &mut s.ids, 0)?;
            backend.write_range(&sum, &mut s.rows, 0)?;
            backend.rows_scatter(&geom, &s.ids, &s.rows, grads)?;
        }
        Ok(union)
    }

    /// Rank `from`'s rows of `w` values: their ids (below the table's rows,
    /// increasing) and their values.
    fn parse<'a>(
        &self,
        from: usize,
        data: &'a [f32],
        w: usize,
    ) -> anyhow::Result<(Vec<u32>, &'a [f32])> {
        let rows = self.table.len() / self.width;
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

    /// The gather or scatter of `count` rows of the table.
    fn geom(&self, count: usize) -> RowsGeom {
        RowsGeom {
            count,
            dim: self.width,
            rows: self.table.len() / self.width,
            offset: self.table.start,
        }
    }

    /// The device scratch, with room for at least `count` ids and rows
    /// (grown in powers of two, never past the table).
    fn scratch(&mut self, backend: &B, count: usize) -> anyhow::Result<&mut Scratch<B>> {
        if (self.scratch.as_ref()).is_none_or(|s| B::len(&s.ids) < count) {
            self.scratch = None;
            let room = (count.next_power_of_two())
                .min(self.table.len() / self.width)
                .max(count);
            self.scratch = Some(Scratch {
                ids: backend.zeros(room)?,
                rows: backend.zeros(room * self.width)?,
            });
        }
        self.scratch.as_mut().context("made above")
    }
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
