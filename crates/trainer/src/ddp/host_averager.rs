//! Gradient averaging through the host communicator: each bucket is copied
//! to host memory as soon as backward has written it and all-reduced on the
//! communication thread while backward goes on, then copied back.

use std::ops::Range;

use anyhow::anyhow;
use core_tensor::{FlatLayout, Ops};

use super::buckets::plan_buckets;
use super::comm_thread::{CommThread, Request, Staged};
use crate::model::GradsReady;

/// The bucket plan and the host staging buffers, reused every step. The
/// communicator is lent per step ([`HostAverager::hook`]), as the trainer
/// also uses it for metrics.
pub struct HostAverager {
    buckets: Vec<Range<usize>>,
    /// One staging buffer per bucket (the backend's: page-locked on a GPU);
    /// `None` while it travels to the communication thread and back.
    staging: Vec<Option<Staged>>,
    launched: usize,
}

impl HostAverager {
    pub fn new<B: Ops>(backend: &B, layout: &FlatLayout, bucket_mb: f64) -> anyhow::Result<Self> {
        let buckets = plan_buckets(layout, bucket_mb);
        let staging = buckets
            .iter()
            .map(|b| Ok(Some(Box::new(backend.staging(b.len())?) as Staged)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            buckets,
            staging,
            launched: 0,
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
        if self.launched != self.buckets.len() {
            return Err(anyhow!(
                "backward reported {} of {} gradient buckets",
                self.launched,
                self.buckets.len()
            ));
        }
        for i in 0..self.buckets.len() {
            let averaged = comm.next_staged()?;
            backend.write_range(&averaged, grads, self.buckets[i].start)?;
            self.staging[i] = Some(averaged);
        }
        self.launched = 0;
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
        while let Some(bucket) = avg.buckets.get(avg.launched).filter(|b| b.start >= offset) {
            let mut staging = avg.staging[avg.launched]
                .take()
                .ok_or_else(|| anyhow!("gradient bucket {} is still in flight", avg.launched))?;
            backend.read_range(grads, bucket.clone(), &mut staging)?;
            self.comm.submit(Request::AverageF32(staging))?;
            avg.launched += 1;
        }
        Ok(())
    }
}
