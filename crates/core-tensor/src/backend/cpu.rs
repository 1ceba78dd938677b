//! The CPU backend: buffers are `Vec`s, kernels use `gemm` for the matrix
//! products and a private rayon pool for the rest.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use rayon::ThreadPool;

use super::{Backend, Elem, host_memory};
use crate::error::check_len;
use crate::gemm::Parallelism;
use crate::{Error, Result};

/// What [`Backend::transient_bytes`] allows each kernel thread.
const SCRATCH_PER_THREAD: u64 = 16 << 20;

/// How a kernel cuts a reduction over a batch (the convolution's weight
/// gradient) into partial sums, which fixes the order of its terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reductions {
    /// One partial sum per thread: the fastest; the bits depend on the
    /// thread count.
    PerThread,
    /// [`FIXED_PARTIALS`] partial sums whatever the thread count, which
    /// share them out: the same bits with any number of threads.
    Fixed,
}

/// The partial sums of [`Reductions::Fixed`] (fewer in a smaller batch).
pub const FIXED_PARTIALS: usize = 4;

/// Host memory and `threads` worker threads.
///
/// With one thread nothing is spawned and every kernel runs inline, which is
/// what a data-parallel rank pinned to one core wants.
#[derive(Clone)]
pub struct Cpu {
    threads: usize,
    reductions: Reductions,
    pool: Option<Arc<ThreadPool>>,
    /// Bytes `zeros` and `upload` handed out so far, by this backend and
    /// its clones (see [`Backend::allocated_bytes`]).
    allocated: Arc<AtomicU64>,
}

impl fmt::Debug for Cpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cpu")
            .field("threads", &self.threads)
            .field("reductions", &self.reductions)
            .finish()
    }
}

impl Cpu {
    /// A CPU backend with `threads` worker threads (at least one).
    pub fn new(threads: usize) -> Result<Self> {
        if threads == 0 {
            return Err(Error::InvalidArgument {
                op: "Cpu::new",
                reason: "the number of threads must be at least 1".into(),
            });
        }
        let pool = if threads == 1 {
            None
        } else {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .thread_name(|i| format!("cpu-kernel-{i}"))
                .build()
                .map_err(|e| Error::ThreadPool {
                    threads,
                    reason: e.to_string(),
                })?;
            Some(Arc::new(pool))
        };
        Ok(Self {
            threads,
            reductions: Reductions::PerThread,
            pool,
            allocated: Arc::default(),
        })
    }

    fn count<T>(&self, len: usize) {
        let bytes = (len as u64).saturating_mul(size_of::<T>() as u64);
        self.allocated.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The same backend, cutting its reductions as `reductions` says.
    pub fn with_reductions(self, reductions: Reductions) -> Self {
        Self { reductions, ..self }
    }

    /// The number of worker threads kernels may use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The partial sums of a reduction over `batch` items.
    pub(crate) fn partials(&self, batch: usize) -> usize {
        let wanted = match self.reductions {
            Reductions::PerThread => self.threads,
            Reductions::Fixed => FIXED_PARTIALS,
        };
        wanted.min(batch).max(1)
    }

    /// The parallelism to hand to `gemm` from inside [`Cpu::run`].
    pub(crate) fn gemm_parallelism(&self) -> Parallelism {
        if self.threads == 1 {
            Parallelism::None
        } else {
            Parallelism::Rayon(self.threads)
        }
    }

    /// Runs `f` inside this backend's pool, so nested rayon work and `gemm`
    /// stay on our threads and never spill onto rayon's global pool.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Calls `f(chunk_index, chunk)` for `out` cut into `chunk_len` pieces, on
    /// all threads. Each chunk is written by exactly one call, so results do
    /// not depend on scheduling.
    pub(crate) fn for_each_chunk(
        &self,
        out: &mut [f32],
        chunk_len: usize,
        f: impl Fn(usize, &mut [f32]) + Send + Sync,
    ) {
        use rayon::prelude::*;
        if chunk_len == 0 {
            return;
        }
        if self.pool.is_none() {
            out.chunks_mut(chunk_len)
                .enumerate()
                .for_each(|(i, c)| f(i, c));
        } else {
            self.run(|| {
                out.par_chunks_mut(chunk_len)
                    .enumerate()
                    .for_each(|(i, c)| f(i, c))
            });
        }
    }
}

impl Backend for Cpu {
    type Storage<T: Elem> = Vec<T>;
    type Staging = Vec<f32>;
    const IN_HOST_MEMORY: bool = true;

    fn describe(&self) -> String {
        let s = if self.threads == 1 { "" } else { "s" };
        format!("cpu ({} thread{s})", self.threads)
    }

    fn zeros<T: Elem>(&self, len: usize) -> Result<Vec<T>> {
        let zeros = host_memory::zeroed(len)?;
        self.count::<T>(len);
        Ok(zeros)
    }

    fn upload<T: Elem>(&self, host: &[T]) -> Result<Vec<T>> {
        let copy = host_memory::copied(host)?;
        self.count::<T>(host.len());
        Ok(copy)
    }

    fn allocated_bytes(&self) -> u64 {
        self.allocated.load(Ordering::Relaxed)
    }

    /// The kernels' own scratch, in `Vec`s of their own: per thread an
    /// im2col image, a product's packed blocks, partial sums (under 2 MiB
    /// a thread for the CNN), and what the allocator maps around them.
    fn transient_bytes(&self) -> u64 {
        self.threads as u64 * SCRATCH_PER_THREAD
    }

    fn free_device_memory(&self) -> Result<Option<(String, u64)>> {
        Ok(None)
    }

    fn len<T: Elem>(storage: &Vec<T>) -> usize {
        storage.len()
    }

    type Shared<T: Elem> = Arc<Vec<T>>;

    fn share<T: Elem>(&self, host: &Arc<Vec<T>>) -> Result<Arc<Vec<T>>> {
        Ok(Arc::clone(host))
    }

    fn shared_len<T: Elem>(shared: &Arc<Vec<T>>) -> usize {
        shared.len()
    }

    fn staging(&self, len: usize) -> Result<Vec<f32>> {
        host_memory::zeroed(len)
    }

    fn read_range<T: Elem>(
        &self,
        storage: &Vec<T>,
        range: Range<usize>,
        host: &mut [T],
    ) -> Result<()> {
        let src = storage
            .get(range.clone())
            .ok_or_else(|| out_of_bounds("read_range", &range, storage.len()))?;
        check_len("read_range", "host", host.len(), src.len())?;
        host.copy_from_slice(src);
        Ok(())
    }

    fn write_range<T: Elem>(&self, host: &[T], storage: &mut Vec<T>, offset: usize) -> Result<()> {
        copy_at("write_range", host, storage, offset)
    }

    fn fill<T: Elem>(&self, storage: &mut Vec<T>, value: T) -> Result<()> {
        storage.fill(value);
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    type Mark = Instant;

    fn mark(&self) -> Result<Instant> {
        Ok(Instant::now())
    }

    fn record_mark(&self, mark: &mut Instant) -> Result<()> {
        *mark = Instant::now();
        Ok(())
    }

    fn seconds_between(&self, start: &Instant, end: &Instant) -> Result<f64> {
        Ok(end.saturating_duration_since(*start).as_secs_f64())
    }
}

/// `dst[offset..offset + src.len()] = src`, or `op`'s error when that
/// range is not inside `dst`.
fn copy_at<T: Elem>(op: &'static str, src: &[T], dst: &mut [T], offset: usize) -> Result<()> {
    let range = offset..offset.saturating_add(src.len());
    let len = dst.len();
    dst.get_mut(range.clone())
        .ok_or_else(|| out_of_bounds(op, &range, len))?
        .copy_from_slice(src);
    Ok(())
}

fn out_of_bounds(op: &'static str, range: &Range<usize>, len: usize) -> Error {
    Error::InvalidArgument {
        op,
        reason: format!("range {range:?} is outside a buffer of {len} elements"),
    }
}
