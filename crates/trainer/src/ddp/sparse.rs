//! Row-sparse gradients (a model's [`Model::sparse_table`]) over the host
//! communicator: each step, after the dense buckets, every rank either
//! sends only the rows it wrote (indices + rows) to all ranks, or the
//! table goes through the dense all-reduce, whichever moves fewer bytes,
//! decided alike on every rank from the all-reduced row counts.
//!
//! The rows are summed as the dense all-reduce would sum them: per row,
//! rank 0's row (zeros when it sent none) plus each next rank's, in rank
//! order, then multiplied by `1 / world`. Rows a rank leaves out are all
//! `+0.0`, exactly what it would have added densely, so at two ranks (where
//! the ring's `a + b` is `b + a`) the result is the dense one bit for bit.
//!
//! [`Model::sparse_table`]: crate::model::Model::sparse_table

use std::ops::Range;

use anyhow::{Context, bail};
use core_tensor::Ops;

use super::comm_thread::{CommHandle, CommThread, Op, Staged};
use crate::cli::SparseGrads;

/// Row indices travel as f32: exact below 2^24.
const MAX_ROWS: usize = 1 << 24;

/// The table, its host copy, and the handle its exchanges go through.
pub struct SparseExchange {
    table: Range<usize>,
    width: usize,
    always: bool,
    comm: CommHandle,
    rank: usize,
    world: usize,
    host: Vec<f32>,
    steps: u64,
}

impl SparseExchange {
    /// The exchange for a model's `table` (range, row width), or `None`
    /// where the table keeps the dense buckets (`--sparse-grads never`, no
    /// table, one rank, or too many rows for `auto`).
    pub fn plan(
        table: Option<(Range<usize>, usize)>,
        mode: SparseGrads,
        comm: &CommThread,
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
            host: vec![0.0; table.len()],
            table,
            width,
            always: mode == SparseGrads::Always,
            comm: comm.handle(),
            rank: comm.rank(),
            world: comm.world_size(),
            steps: 0,
        }))
    }

    /// `buckets` without the elements of `sparse`'s table, launch order
    /// kept (a bucket the table splits becomes its upper, then lower part).
    pub fn dense_buckets(
        sparse: Option<&SparseExchange>,
        buckets: Vec<Range<usize>>,
    ) -> Vec<Range<usize>> {
        match sparse {
            Some(sparse) => without(&sparse.table, buckets),
            None => buckets,
        }
    }

    /// Averages the table's gradients in `grads` over all ranks.
    pub fn exchange<B: Ops>(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        let (w, world) = (self.width, self.world);
        backend.read_range(grads, self.table.clone(), &mut self.host)?;
        // The rows this rank wrote: those not all `+0.0` (an OR of the bits,
        // which vectorizes, unlike a search that stops early).
        let touched: Vec<usize> = (self.host.chunks_exact(w).enumerate())
            .filter(|(_, row)| row.iter().fold(0, |bits, x| bits | x.to_bits()) != 0)
            .map(|(i, _)| i)
            .collect();
        let mut counts = vec![0.0; world];
        counts[self.rank] = touched.len() as f64;
        let sent: f64 = self.comm.sum_f64(counts)?.iter().sum();
        // Each rank's rows cross world - 1 links (ring broadcast); the ring
        // all-reduce sends twice the table over the same links.
        let (sparse_bytes, dense_bytes) = (
            (world - 1) as u64 * sent as u64 * (1 + w) as u64 * 4,
            (world - 1) as u64 * 2 * self.host.len() as u64 * 4,
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
            self.sum_rows(&touched)?;
        } else {
            let staged: Staged = Box::new(std::mem::take(&mut self.host));
            self.comm.submit(Op::AverageF32(staged))?;
            self.host = self.comm.next_staged()?.to_vec();
        }
        backend.write_range(&self.host, grads, self.table.start)?;
        Ok(())
    }

    /// Sends `touched` rows to every rank and leaves their average in
    /// `host` (zeros elsewhere).
    fn sum_rows(&mut self, touched: &[usize]) -> anyhow::Result<()> {
        let (w, rows) = (self.width, self.host.len() / self.width);
        let mut payload: Vec<f32> = touched.iter().map(|&r| r as f32).collect();
        for &r in touched {
            payload.extend_from_slice(&self.host[r * w..(r + 1) * w]);
        }
        let gathered = self.comm.all_gather(payload)?;
        let mut parsed = Vec::with_capacity(gathered.len());
        let mut in_union = vec![false; rows];
        for (from, data) in gathered.iter().enumerate() {
            let k = data.len() / (1 + w);
            let (ids, values) = data.split_at(k);
            let ids = ids
                .iter()
                .map(|&id| {
                    let row = id as usize;
                    (id == row as f32 && row < rows && data.len() == k * (1 + w))
                        .then_some(row)
                        .with_context(|| format!("rank {from} sent a bad sparse gradient row {id}"))
                })
                .collect::<anyhow::Result<Vec<usize>>>()?;
            ids.iter().for_each(|&r| in_union[r] = true);
            parsed.push((ids, values));
        }
        let union: Vec<usize> = (0..rows).filter(|&r| in_union[r]).collect();
        // Rows outside the union are `+0.0` in `host` already: this rank
        // did not write them. Each union row is summed in rank order; a rank
        // that sent no such row adds `+0.0`, as it would in the dense sum.
        let mut slot = vec![NOT_SENT; rows];
        for (from, (ids, values)) in parsed.iter().enumerate() {
            ids.iter().enumerate().for_each(|(j, &r)| slot[r] = j);
            for &r in &union {
                let out = &mut self.host[r * w..(r + 1) * w];
                match (slot[r], from) {
                    (NOT_SENT, 0) => out.fill(0.0),
                    (NOT_SENT, _) => out.iter_mut().for_each(|o| *o += 0.0),
                    (j, 0) => out.copy_from_slice(&values[j * w..(j + 1) * w]),
                    (j, _) => {
                        (out.iter_mut().zip(&values[j * w..(j + 1) * w])).for_each(|(o, v)| *o += v)
                    }
                }
            }
            ids.iter().for_each(|&r| slot[r] = NOT_SENT);
        }
        let scale = 1.0 / self.world as f32;
        for &r in &union {
            self.host[r * w..(r + 1) * w]
                .iter_mut()
                .for_each(|x| *x *= scale);
        }
        Ok(())
    }
}

/// A row a rank did not send, in `sum_rows`' row-to-slot map.
const NOT_SENT: usize = usize::MAX;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dense_buckets_leave_out_the_table_and_keep_launch_order() {
        // recsys: the table first in the buffer, in the last bucket.
        assert_eq!(
            without(&(0..50), vec![80..100, 0..80]),
            vec![80..100, 50..80]
        );
        // A table inside one bucket splits it, upper part first.
        assert_eq!(
            without(&(40..60), vec![80..100, 0..80]),
            vec![80..100, 60..80, 0..40]
        );
        assert_eq!(without(&(0..100), vec![80..100, 0..80]), vec![]);
    }
}
