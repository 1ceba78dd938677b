use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use comm::{CommConfig, TcpCommunicator};
use core_tensor::{Backend, Cpu, Elem, Result};

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

/// A table of 1,000 rows of 4 at element 3 of a gradient buffer of 4,008.
const TABLE: Range<usize> = 3..4003;
const WIDTH: usize = 4;

/// Rank `rank`'s gradient after backward: row `r` of the table holds
/// `r + rank / 8 + column / 16` where `r` is one of `rows`, zeros
/// elsewhere in the table (as the embedding's backward leaves them), and 7
/// outside it.
fn grads(rank: usize, rows: &[u32]) -> Vec<f32> {
    let mut g = vec![7.0f32; TABLE.end + 5];
    g[TABLE].fill(0.0);
    for &r in rows {
        for c in 0..WIDTH {
            g[TABLE.start + r as usize * WIDTH + c] =
                r as f32 + rank as f32 / 8.0 + c as f32 / 16.0;
        }
    }
    g
}

/// Two ranks exchange their batches' rows, twice (the second time more of
/// them, so the scratch grows): each reads only its rows from the device
/// and writes back only the union, every union row ends as the dense
/// average's `(rank 0 + rank 1) · ½` (zeros from a rank that did not send
/// it), and nothing else in the buffer changes.
#[test]
fn the_exchange_moves_only_the_batchs_rows_between_device_and_host() {
    let steps: [[&[u32]; 2]; 2] = [
        [&[1, 5, 7, 900], &[5, 8, 999]],
        [&[0, 2, 3, 4, 6, 10, 11, 12, 13], &[2, 999]],
    ];
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let results: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..2)
            .map(|rank| {
                s.spawn(move || {
                    let config = CommConfig::new(rank, 2, "127.0.0.1", port)
                        .with_timeout(Duration::from_secs(20));
                    let comm = TcpCommunicator::connect(&config).unwrap();
                    let thread = CommThread::spawn(Box::new(comm)).unwrap();
                    let table = Some((TABLE, WIDTH));
                    let mut sparse =
                        SparseExchange::plan(table, SparseGrads::Always, &thread, false)
                            .unwrap()
                            .unwrap();
                    let backend = Counted {
                        cpu: Cpu::new(1).unwrap(),
                        read: Arc::default(),
                        written: Arc::default(),
                    };
                    let mut out = Vec::new();
                    for step in steps {
                        let (mine, union) = (step[rank], union(step));
                        let mut g = grads(rank, mine);
                        sparse.exchange(&backend, &mut g, Some(mine)).unwrap();
                        let (read, written) = backend.take();
                        assert_eq!(read, mine.len() * WIDTH, "rank {rank} read");
                        assert_eq!(
                            written,
                            mine.len() + union.len() * (1 + WIDTH),
                            "rank {rank} wrote"
                        );
                        out.push(g);
                    }
                    out
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(results[0], results[1], "the ranks agree");
    for (step, got) in steps.iter().zip(&results[0]) {
        let (g0, g1) = (grads(0, step[0]), grads(1, step[1]));
        let union = union(*step);
        for (i, (&x, (&a, &b))) in got.iter().zip(g0.iter().zip(&g1)).enumerate() {
            let row = i.wrapping_sub(TABLE.start) / WIDTH;
            let want = if !TABLE.contains(&i) {
                7.0
            } else if union.contains(&(row as u32)) {
                (a + b) * 0.5
            } else {
                0.0
            };
            assert_eq!(x.to_bits(), want.to_bits(), "element {i} (row {row})");
        }
    }
}

/// The rows either rank sent, in order.
fn union(step: [&[u32]; 2]) -> Vec<u32> {
    let mut all: Vec<u32> = step.concat();
    all.sort_unstable();
    all.dedup();
    all
}
