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
    /// `None` while it travels to the communication thread and back. The
    /// last bucket's has one slot more, past its gradients, for the stop
    /// vote: it rides the step's last all-reduce for free.
    staging: Vec<Option<Staged>>,
    vote: f32,
    any_vote: bool,
}

impl HostHook {
    pub fn new<B: Ops>(
        backend: &B,
        buckets: &[Range<usize>],
        comm: CommHandle,
    ) -> anyhow::Result<Self> {
        let staging = buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let vote_slot = usize::from(i + 1 == buckets.len());
                Ok(Some(
                    Box::new(backend.staging(b.len() + vote_slot)?) as Staged
                ))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            comm,
            staging,
            vote: 0.0,
            any_vote: false,
        })
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
        if bucket.last {
            staging[len] = self.vote;
        }
        self.comm.submit(Op::AverageF32(staging))
    }

    fn finish(
        &mut self,
        backend: &B,
        grads: &mut B::Storage<f32>,
        buckets: &[Range<usize>],
    ) -> anyhow::Result<()> {
        for (i, bucket) in buckets.iter().enumerate() {
            let averaged = self.comm.next_staged()?;
            let len = bucket.len();
            backend.write_range(&averaged[..len], grads, bucket.start)?;
            if i + 1 == buckets.len() {
                // The average of 0/1 votes is above zero iff one rank voted.
                self.any_vote = averaged[len] > 0.0;
            }
            self.staging[i] = Some(averaged);
        }
        Ok(())
    }

    fn carry_vote(&mut self, vote: bool) -> bool {
        self.vote = f32::from(u8::from(vote));
        true
    }

    fn any_vote(&self) -> bool {
        self.any_vote
    }
}
