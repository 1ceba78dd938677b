//! Data parallelism: how each rank's gradients become the average over all
//! ranks every step, with the communication overlapping backward.
//!
//! The seam is PyTorch DDP's communication hook (`hook(state, bucket) ->
//! future`): a [`CommHook`] starts averaging one bucket when backward has
//! written it and completes them all before the optimizer runs; the
//! [`Reducer`] owns the bucket plan and the order, and is what backward's
//! [`GradsReady`] calls reach. Buckets follow PyTorch DDP (`buckets.rs`):
//! parameters in reverse order (the order backward produces them), a small
//! first bucket (1 MiB) so communication starts early, then
//! `bucket_mb`-sized ones. Two hooks exist:
//!
//! * [`HostHook`]: through the host communicator ([`CommThread`], the TCP
//!   ring) for CPU ranks, and for GPU ranks whose gradients are staged
//!   through host memory.
//! * [`NcclHook`]: on the GPU, NCCL all-reduces on a communication stream
//!   ordered against the compute stream by events.
//!
//! `--comm-hook` chooses what a bucket becomes on the wire (as PyTorch's
//! `register_comm_hook`): float32; bf16 or fp16 (both hooks); PowerSGD's
//! low-rank factors with error feedback (`powersgd/`, the host hook only).
//! `transport.rs` decides which hook a job uses (`--backend`);
//! [`Averaging`] is what a rank's step calls: the buckets through a hook,
//! a model's row tables through the sparse exchange.

pub mod averaging;
mod buckets;
mod flags;
mod host_hook;
mod nccl_hook;
pub mod powersgd;
mod sparse;
pub mod transport;

use std::ops::Range;

pub use averaging::{AverageOver, Averaging};
pub use buckets::plan_buckets;
pub use flags::{BackendChoice, CommHookChoice, DdpFlags, HalfFormat, POWERSGD_START, SparseGrads};
pub use host_hook::{HostHook, HostWire};
pub use nccl_hook::NcclHook;
pub use sparse::SparseExchange;

use buckets::BucketQueue;
use comm::IntReduce;
use core_tensor::Ops;
use powersgd::PowerSgdState;

use crate::comm_thread::CommThread;
use crate::model::GradsReady;

/// One bucket of the flat gradient buffer, final after backward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GradBucket {
    /// Position in the plan (launch order).
    pub index: usize,
    /// The bucket's elements in the flat buffer.
    pub range: Range<usize>,
    /// Whether this is the step's last bucket.
    pub last: bool,
}

/// How a bucket of gradients becomes the average over all ranks.
pub trait CommHook<B: Ops> {
    /// A step begins, `step` optimizer steps having been done before it
    /// (PowerSGD's `iter`: it compresses from `start_powerSGD_iter` on).
    fn begin_step(&mut self, _step: u64) {}

    /// Starts averaging `bucket` of `grads` (its gradients are final);
    /// returns without waiting for the result.
    fn launch(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        bucket: &GradBucket,
    ) -> anyhow::Result<()>;

    /// Completes every launched bucket, in launch order, so that the
    /// optimizer (on the host, or later in device stream order) reads the
    /// averages in `grads`; reports a failed collective.
    fn finish(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        buckets: &[Range<usize>],
    ) -> anyhow::Result<()>;

    /// Reports a collective that failed since the last look. After a
    /// device synchronisation this covers every step queued before it.
    fn check(&self) -> anyhow::Result<()> {
        Ok(())
    }

    /// Bytes this rank sent in its gradient collectives since the last
    /// call ([`ring_bytes`] of each).
    fn take_sent_bytes(&mut self) -> u64 {
        0
    }

    /// PowerSGD's state, for a checkpoint (`None`: no PowerSGD, or not
    /// started yet). Between steps only.
    fn powersgd_state(&self) -> anyhow::Result<Option<PowerSgdState>> {
        Ok(None)
    }

    /// Continues PowerSGD from a checkpoint's state.
    fn restore_powersgd(&mut self, _state: &PowerSgdState) -> anyhow::Result<()> {
        Ok(())
    }

    /// The hook's own exact integer all-reduce, for `--reproducible`'s
    /// sums (`None`: they go through the job's host communicator).
    fn integers(&mut self) -> Option<&mut dyn IntegerReduce> {
        None
    }
}

/// An exact all-reduce of integers over the replicas (see
/// [`IntReduce`]): `--reproducible`'s scales and sums, through the host's
/// communicator ([`CommThread`]) or a device hook's (NCCL's `ncclInt64`).
pub trait IntegerReduce {
    fn world_size(&self) -> usize;

    /// `values` reduced over every replica as `op` says.
    fn reduce_i64(&mut self, values: Vec<i64>, op: IntReduce) -> anyhow::Result<Vec<i64>>;
}

impl IntegerReduce for CommThread {
    fn world_size(&self) -> usize {
        CommThread::world_size(self)
    }

    fn reduce_i64(&mut self, values: Vec<i64>, op: IntReduce) -> anyhow::Result<Vec<i64>> {
        CommThread::reduce_i64(self, values, op)
    }
}

/// Bytes one rank sends in a ring all-reduce of `elements` of `size` bytes
/// among `world` ranks: `world - 1` parts of `1 / world` of the buffer in
/// the reduce-scatter and as many in the all-gather (what nccl-tests' bus
/// bandwidth counts).
pub fn ring_bytes(elements: usize, size: usize, world: usize) -> u64 {
    match world {
        0 | 1 => 0,
        _ => (2 * (world - 1) * elements * size / world) as u64,
    }
}

/// The bucket plan, its progress through one backward pass, and the hook
/// that averages each bucket: what backward's [`GradsReady`] calls reach.
pub struct Reducer<B: Ops> {
    queue: BucketQueue,
    hook: Box<dyn CommHook<B>>,
}

impl<B: Ops> Reducer<B> {
    pub fn new(buckets: Vec<Range<usize>>, hook: Box<dyn CommHook<B>>) -> Self {
        Self {
            queue: BucketQueue::new(buckets),
            hook,
        }
    }

    pub fn hook(&self) -> &dyn CommHook<B> {
        self.hook.as_ref()
    }

    pub fn hook_mut(&mut self) -> &mut dyn CommHook<B> {
        self.hook.as_mut()
    }

    /// The gradient elements the buckets carry each step.
    pub fn elements(&self) -> usize {
        self.queue.buckets().iter().map(|b| b.len()).sum()
    }

    /// Ends the step's communication: every bucket must have been launched.
    pub fn finish(&mut self, backend: &B, grads: &mut B::Storage<f32>) -> anyhow::Result<()> {
        self.queue.end_step()?;
        self.hook.finish(backend, grads, self.queue.buckets())
    }
}

impl<B: Ops> GradsReady<B> for Reducer<B> {
    fn ready(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        offset: usize,
    ) -> anyhow::Result<()> {
        let count = self.queue.buckets().len();
        while let Some((index, range)) = self.queue.next_ready(offset) {
            let bucket = GradBucket {
                index,
                range,
                last: index + 1 == count,
            };
            self.hook.launch(backend, grads, &bucket)?;
        }
        Ok(())
    }
}
