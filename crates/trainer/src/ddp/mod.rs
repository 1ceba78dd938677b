//! Data parallelism: how each rank's gradients become the average over all
//! ranks every step, with the communication overlapping backward.
//!
//! Buckets follow PyTorch DDP (`buckets.rs`): parameters in reverse order
//! (the order backward produces them), a small first bucket (1 MiB) so
//! communication starts early, then `bucket_mb`-sized ones. Each bucket is
//! launched from the [`GradsReady`] hook as soon as backward has written it.
//! Two paths share that plan:
//!
//! * [`HostAverager`]: through the host communicator ([`CommThread`], the
//!   TCP ring) for CPU ranks, and for GPU ranks whose gradients are staged
//!   through host memory.
//! * [`NcclAverager`]: on the GPU, NCCL all-reduces on a communication
//!   stream ordered against the compute stream by events.
//!
//! `transport.rs` decides between them (`--backend`).

mod buckets;
mod comm_thread;
mod host_averager;
mod nccl_averager;
pub mod transport;

pub use buckets::plan_buckets;
pub use comm_thread::CommThread;
pub use host_averager::{HostAverager, HostHook};
pub use nccl_averager::NcclAverager;

use core_tensor::Ops;

use crate::model::GradsReady;

/// Gradient averaging that runs on the device itself: launched bucket by
/// bucket from backward's hook, completed (on the device, in stream order)
/// by [`DeviceAverager::finish`] before the optimizer reads the gradients.
pub trait DeviceAverager<B: Ops>: GradsReady<B> {
    /// Orders the optimizer after every bucket's collective; reports a
    /// failed collective.
    fn finish(&mut self, backend: &B) -> anyhow::Result<()>;

    /// Reports a collective that failed since the last look. After a
    /// device synchronisation this covers every step queued before it.
    fn check(&self) -> anyhow::Result<()>;
}
