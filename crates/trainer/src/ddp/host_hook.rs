//! Gradient averaging through the host communicator: each bucket is copied
//! to host memory as soon as backward has written it and all-reduced on the
//! communication thread while backward goes on, then copied back.

use std::ops::Range;

use anyhow::anyhow;
use core_tensor::Ops;

use super::{CommHook, GradBucket};
use crate::comm_thread::{CommHandle, Op, Staged};

/// The host staging buffers, reused every step, and the communication
/// thread they travel to.
pub struct HostHook {
    comm: CommHandle,
    /// One staging buffer per bucket (the backend's: page-locked on a GPU);
    /// `None` while it travels to the communication thread and back.
    staging: Vec<Option<Staged>>,
}

impl HostHook {
    pub fn new<B: Ops>(
        backend: &B,
        buckets: &[Range<usize>],
        comm: CommHandle,
    ) -> anyhow::Result<Self> {
        let staging = buckets
            .iter()
            .map(|b| Ok(Some(Box::new(backend.staging(b.len())?) as Staged)))
            .collect::<anyhow::Result<_>>()?;
        Ok(Self { comm, staging })
    }
}

impl<B: Ops> CommHook<B> for HostHook {
    fn launch(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        bucket: &GradBucket,
    ) -> anyhow::Result<()> {
        let i = bucket.index;
        let mut staging = self.staging[i]
            .take()
            .ok_or_else(|| anyhow!("gradient bucket {i} is still in flight"))?;
        let len = bucket.range.len();
        backend.read_range(grads, bucket.range.clone(), &mut staging[..len])?;
        self.comm.submit(Op::AverageF32(staging, Some(i)))
    }

    fn finish(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        buckets: &[Range<usize>],
    ) -> anyhow::Result<()> {
        for (i, bucket) in buckets.iter().enumerate() {
            let averaged = self.comm.next_staged()?;
            backend.write_range(&averaged[..bucket.len()], grads, bucket.start)?;
            self.staging[i] = Some(averaged);
        }
        Ok(())
    }
}
