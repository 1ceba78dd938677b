//! Gradient averaging through the host communicator: each bucket is copied
//! to host memory as soon as backward has written it and all-reduced on the
//! communication thread while backward goes on, then copied back.

use anyhow::anyhow;
use core_tensor::{FlatLayout, Ops};

use super::buckets::{BucketQueue, plan_buckets};
use super::comm_thread::{CommThread, Request, Staged};
use crate::model::GradsReady;

/// The bucket plan and the host staging buffers, reused every step. The
/// communicator is lent per step ([`HostAverager::hook`]), as the trainer
/// also uses it for metrics.
pub struct HostAverager {
    queue: BucketQueue,
    /// One staging buffer per bucket (the backend's: page-locked on a GPU);
    /// `None` while it travels to the communication thread and back.
    staging: Vec<Option<Staged>>,
}

impl HostAverager {
    pub fn new<B: Ops>(backend: &B, layout: &FlatLayout, bucket_mb: f64) -> anyhow::Result<Self> {
        let buckets = plan_buckets(layout, bucket_mb);
        let staging = buckets
            .iter()
            .map(|b| Ok(Some(Box::new(backend.staging(b.len())?) as Staged)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            queue: BucketQueue::new(buckets),
            staging,
        })
    }

    /// The [`GradsReady`] hook of one backward pass.
    pub fn hook<'a>(&'a mut self, comm: &'a mut CommThread) -> HostHook<'a> {
        HostHook {
            averager: self,
            comm,
        }
    }

    /// Waits for every bucket and writes the averaged gradients back.
    pub fn finish<B: Ops>(
        &mut self,
        comm: &mut CommThread,
        backend: &B,
        grads: &mut B::Storage<f32>,
    ) -> anyhow::Result<()> {
        self.queue.end_step()?;
        for (i, bucket) in self.queue.buckets().iter().enumerate() {
            let averaged = comm.next_staged()?;
            backend.write_range(&averaged, grads, bucket.start)?;
            self.staging[i] = Some(averaged);
        }
        Ok(())
    }
}

/// [`HostAverager`] with the communicator for one backward pass.
pub struct HostHook<'a> {
    averager: &'a mut HostAverager,
    comm: &'a mut CommThread,
}

impl<B: Ops> GradsReady<B> for HostHook<'_> {
    fn ready(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        offset: usize,
    ) -> anyhow::Result<()> {
        let avg = &mut *self.averager;
        while let Some((i, bucket)) = avg.queue.next_ready(offset) {
            let mut staging = avg.staging[i]
                .take()
                .ok_or_else(|| anyhow!("gradient bucket {i} is still in flight"))?;
            backend.read_range(grads, bucket, &mut staging)?;
            self.comm.submit(Request::AverageF32(staging))?;
        }
        Ok(())
    }
}
