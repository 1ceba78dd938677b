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
//! Gradient compression (bf16/fp16 on the wire) would be one more hook.
//! `transport.rs` decides which one a job uses (`--backend`);
//! [`Averaging`] is what a rank's step calls: the buckets through a hook,
//! a model's row tables through the sparse exchange.

pub mod averaging;
mod buckets;
mod flags;
mod host_hook;
mod nccl_hook;
mod sparse;
pub mod transport;

use std::ops::Range;

pub use averaging::{AverageOver, Averaging};
pub use buckets::plan_buckets;
pub use flags::{BackendChoice, DdpFlags, SparseGrads};
pub use host_hook::HostHook;
pub use nccl_hook::NcclHook;
pub use sparse::SparseExchange;

use buckets::BucketQueue;
use core_tensor::Ops;

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
