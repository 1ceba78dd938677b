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
//! `transport.rs` decides which one a job uses (`--backend`).

mod buckets;
mod flags;
mod host_hook;
mod nccl_hook;
mod sparse;
pub mod transport;

use std::ops::Range;

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

    /// Carries this rank's stop vote with the step's collectives, if the
    /// hook can at no cost; `false` when it cannot, and the trainer votes
    /// some other way.
    fn carry_vote(&mut self, _vote: bool) -> bool {
        false
    }

    /// Whether any rank voted to stop in the step just finished, for a hook
    /// that carried the votes.
    fn any_vote(&self) -> bool {
        false
    }
}

/// The bucket plan, its progress through one backward pass, and the hook
/// that averages each bucket: what backward's [`GradsReady`] calls reach.
pub struct Reducer<B: Ops> {
    queue: BucketQueue,
    hook: Box<dyn CommHook<B>>,
    /// Whether the hook may carry stop votes: not when it averages over a
    /// sub-group (a pipeline stage's replicas), where other ranks vote.
    may_carry_votes: bool,
    /// Whether the hook carries this step's stop votes.
    carries_votes: bool,
    /// The row-sparse tables, exchanged apart from the buckets.
    sparse: Option<SparseExchange<B>>,
}

impl<B: Ops> Reducer<B> {
    pub fn new(buckets: Vec<Range<usize>>, hook: Box<dyn CommHook<B>>) -> Self {
        Self {
            queue: BucketQueue::new(buckets),
            hook,
            may_carry_votes: true,
            carries_votes: false,
            sparse: None,
        }
    }

    /// A reducer whose hook averages over a sub-group of the job: the stop
    /// votes, which every rank must see, travel some other way.
    pub fn over_subgroup(mut self) -> Self {
        self.may_carry_votes = false;
        self
    }

    /// Exchanges the row-sparse tables apart from the buckets (which must
    /// not cover them), after them, every step.
    pub fn with_sparse(mut self, sparse: Option<SparseExchange<B>>) -> Self {
        self.sparse = sparse;
        self
    }

    pub fn hook(&self) -> &dyn CommHook<B> {
        self.hook.as_ref()
    }

    /// Hands this rank's stop vote to the step about to run.
    pub fn carry_vote(&mut self, vote: bool) {
        self.carries_votes = self.may_carry_votes && self.hook.carry_vote(vote);
    }

    /// After [`Reducer::finish`]: whether any rank voted to stop, if the
    /// step's collectives carried the votes.
    pub fn carried_votes(&self) -> Option<bool> {
        self.carries_votes.then(|| self.hook.any_vote())
    }

    /// Whether [`Reducer::finish`] returns the union of every rank's rows
    /// of the row tables each step (see [`SparseExchange::plan`]).
    pub fn forms_row_union(&self) -> bool {
        self.sparse.as_ref().is_some_and(|s| s.forms_union())
    }

    /// After [`Reducer::finish`] returned the union of the ranks' rows: the
    /// same ids on the device, where the sparse exchange left them there
    /// (see [`SparseExchange::union_on_device`]).
    pub fn row_union_on_device(&self) -> Option<&B::Storage<u32>> {
        self.sparse.as_ref()?.union_on_device()
    }

    /// The gradient elements the dense buckets carry each step: every
    /// parameter trained but the row tables a sparse exchange carries.
    pub fn dense_elements(&self) -> usize {
        self.queue.buckets().iter().map(|b| b.len()).sum()
    }

    /// Ends the step's communication: every bucket must have been launched.
    /// `sparse_rows` are the rows of the row tables the step's batch
    /// looked up ([`crate::model::Model::sparse_rows`]). Returns the union
    /// of every rank's such rows where the sparse exchange formed it.
    pub fn finish(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        sparse_rows: Option<&[u32]>,
    ) -> anyhow::Result<Option<Vec<u32>>> {
        self.queue.end_step()?;
        self.hook.finish(backend, grads, self.queue.buckets())?;
        match &mut self.sparse {
            Some(sparse) => sparse.exchange(backend, grads, sparse_rows),
            None => Ok(None),
        }
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
