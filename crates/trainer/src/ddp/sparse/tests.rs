use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use core_tensor::{Backend, Cpu, Elem, Result};

use super::*;
use crate::comm_thread::CommThread;

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

/// The CPU backend, counting the elements that cross between the device
/// and the host.
#[derive(Clone, Debug)]
struct Counted {
    cpu: Cpu,
    read: Arc<AtomicUsize>,
    written: Arc<AtomicUsize>,
}

impl Counted {
    /// The elements read and written since the last call.
    fn take(&self) -> (usize, usize) {
        (
            self.read.swap(0, Ordering::Relaxed),
            self.written.swap(0, Ordering::Relaxed),
        )
    }
}

impl Backend for Counted {
    type Storage<T: Elem> = Vec<T>;
    type Staging = Vec<f32>;
    type Shared<T: Elem> = Arc<Vec<T>>;
    type Mark = Instant;
    const IN_HOST_MEMORY: bool = true;

    fn staging(&self, len: usize) -> Result<Vec<f32>> {
        self.cpu.staging(len)
    }
    fn describe(&self) -> String {
        self.cpu.describe()
    }
    fn zeros<T: Elem>(&self, len: usize) -> Result<Vec<T>> {
        self.cpu.zeros(len)
    }
    fn upload<T: Elem>(&self, host: &[T]) -> Result<Vec<T>> {
        self.written.fetch_add(host.len(), Ordering::Relaxed);
        self.cpu.upload(host)
    }
    fn allocated_bytes(&self) -> u64 {
        self.cpu.allocated_bytes()
    }
    fn free_device_memory(&self) -> Result<Option<(String, u64)>> {
        self.cpu.free_device_memory()
    }
    fn len<T: Elem>(storage: &Vec<T>) -> usize {
        storage.len()
    }
    fn share<T: Elem>(&self, host: &Arc<Vec<T>>) -> Result<Arc<Vec<T>>> {
        self.cpu.share(host)
    }
    fn shared_len<T: Elem>(shared: &Arc<Vec<T>>) -> usize {
        shared.len()
    }
    fn read_range<T: Elem>(&self, s: &Vec<T>, range: Range<usize>, host: &mut [T]) -> Result<()> {
        self.read.fetch_add(range.len(), Ordering::Relaxed);
        self.cpu.read_range(s, range, host)
    }
    fn write_range<T: Elem>(&self, host: &[T], s: &mut Vec<T>, offset: usize) -> Result<()> {
        self.written.fetch_add(host.len(), Ordering::Relaxed);
        self.cpu.write_range(host, s, offset)
    }
    fn fill<T: Elem>(&self, storage: &mut Vec<T>, value: T) -> Result<()> {
        self.cpu.fill(storage, value)
    }
    fn synchronize(&self) -> Result<()> {
        self.cpu.synchronize()
    }
    fn mark(&self) -> Result<Instant> {
        self.cpu.mark()
    }
    fn record_mark(&self, mark: &mut Instant) -> Result<()> {
        self.cpu.record_mark(mark)
    }
    fn seconds_between(&self, start: &Instant, end: &Instant) -> Result<f64> {
        self.cpu.seconds_between(start, end)
    }
}

impl RowsKernel for Counted {
    fn rows_gather(
        &self,
        g: &RowsGeom,
        ids: &Vec<u32>,
        flat: &Vec<f32>,
        rows: &mut Vec<f32>,
    ) -> Result<()> {
        self.cpu.rows_gather(g, ids, flat, rows)
    }
    fn rows_scatter(
        &self,
        g: &RowsGeom,
        ids: &Vec<u32>,
        rows: &Vec<f32>,
        flat: &mut Vec<f32>,
    ) -> Result<()> {
        self.cpu.rows_scatter(g, ids, rows, flat)
    }
}

/// Two row tables indexed by the same ids, as recsys' embedding and its
/// per-row biases: 1,000 rows of 4 at element 3 of a gradient buffer of
/// 5,008, then 1,000 rows of 1.
const TABLE: Range<usize> = 3..4003;
const WIDTH: usize = 4;
const BIASES: Range<usize> = 4003..5003;

/// The table (range and width) and the row of it element `i` lies in.
fn row_of(i: usize) -> Option<(Range<usize>, usize, u32)> {
    [(TABLE, WIDTH), (BIASES, 1)]
        .into_iter()
        .find(|(t, _)| t.contains(&i))
        .map(|(t, w)| (t.clone(), w, ((i - t.start) / w) as u32))
}

/// Rank `rank`'s gradient after backward: row `r` of a table of width `w`
/// holds `r + rank / 8 + column / 16 + w` where `r` is one of `rows`, zeros
/// elsewhere in the tables (as the lookups' backward leaves them), and 7
/// outside them.
fn grads(rank: usize, rows: &[u32]) -> Vec<f32> {
    (0..BIASES.end + 5)
        .map(|i| match row_of(i) {
            None => 7.0,
            Some((_, _, r)) if !rows.contains(&r) => 0.0,
            Some((t, w, r)) => {
                let column = (i - t.start) % w;
                r as f32 + rank as f32 / 8.0 + column as f32 / 16.0 + w as f32
            }
        })
        .collect()
}

/// Two ranks exchange their batches' rows of both tables, twice (the
/// second time more of them, so the scratch grows): each reads only its
/// rows from the device and writes back only the union, every union row
/// of either table ends as the dense average's `(rank 0 + rank 1) · ½`
/// (zeros from a rank that did not send it), the rows no rank sent keep
/// their bits, and nothing else in the buffer changes.
#[test]
fn the_exchange_moves_only_the_batchs_rows_of_every_table() {
    let steps: [[&[u32]; 2]; 2] = [
        [&[1, 5, 7, 900], &[5, 8, 999]],
        [&[0, 2, 3, 4, 6, 10, 11, 12, 13], &[2, 999]],
    ];
    let results = CommThread::on_two_ranks(|rank, thread| {
        let tables = vec![(TABLE, WIDTH), (BIASES, 1)];
        let mut sparse = SparseExchange::plan(tables, SparseGrads::Always, &thread, false)
            .unwrap()
            .unwrap();
        let buckets = vec![4500..BIASES.end + 5, 0..4500];
        assert_eq!(
            SparseExchange::dense_buckets(Some(&sparse), buckets),
            vec![BIASES.end..BIASES.end + 5, 0..TABLE.start],
            "the buckets leave out both tables"
        );
        let backend = Counted {
            cpu: Cpu::new(1).unwrap(),
            read: Arc::default(),
            written: Arc::default(),
        };
        let mut out = Vec::new();
        for step in steps {
            let (mine, union) = (step[rank], union(step));
            let mut g = grads(rank, mine);
            let got = sparse.exchange(&backend, &mut g, Some(mine)).unwrap();
            assert_eq!(got.as_ref(), Some(&union));
            let on_device = sparse.union_on_device().expect("the row path's ids");
            assert_eq!(on_device[..union.len()], union, "the union on the device");
            let (read, written) = backend.take();
            assert_eq!(read, mine.len() * (WIDTH + 1), "rank {rank} read");
            assert_eq!(
                written,
                mine.len() + union.len() * (1 + WIDTH + 1),
                "rank {rank} wrote"
            );
            out.push(g);
        }
        out
    });
    assert_eq!(results[0], results[1], "the ranks agree");
    for (step, got) in steps.iter().zip(&results[0]) {
        let (g0, g1) = (grads(0, step[0]), grads(1, step[1]));
        let union = union(*step);
        let mut averaged = 0;
        for (i, (&x, (&a, &b))) in got.iter().zip(g0.iter().zip(&g1)).enumerate() {
            let want = match row_of(i) {
                None => 7.0,
                Some((_, _, r)) if union.contains(&r) => {
                    averaged += 1;
                    (a + b) * 0.5
                }
                Some(_) => 0.0,
            };
            assert_eq!(x.to_bits(), want.to_bits(), "element {i} ({:?})", row_of(i));
        }
        assert_eq!(averaged, union.len() * (WIDTH + 1));
    }
}

/// Tables of different row counts cannot share the batch's ids.
#[test]
fn tables_of_different_row_counts_are_refused() {
    CommThread::on_two_ranks(|_, thread| {
        let tables = vec![(TABLE, WIDTH), (BIASES.start..BIASES.end - 1, 1)];
        let err = SparseExchange::<Cpu>::plan(tables, SparseGrads::Auto, &thread, false)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("999 rows"), "{err}");
    });
}

/// The rows either rank sent, in order.
fn union(step: [&[u32]; 2]) -> Vec<u32> {
    let mut all: Vec<u32> = step.concat();
    all.sort_unstable();
    all.dedup();
    all
}
