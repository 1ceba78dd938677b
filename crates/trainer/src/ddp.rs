//! Data parallelism over a [`Communicator`]: the communicator runs on its own
//! thread, and gradient buckets are all-reduced there while backward is
//! still computing earlier layers.
//!
//! Buckets follow PyTorch DDP: parameters in reverse order (the order
//! backward produces them), a small first bucket (1 MiB) so communication
//! starts early, then `bucket_mb`-sized ones; a bucket closes once it
//! reaches its cap.

use std::ops::Range;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use anyhow::{Context, anyhow};
use comm::{CommError, Communicator, ReduceOp};
use core_tensor::{FlatLayout, Ops};

use crate::model::GradsReady;

const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// A collective for the communication thread, carrying its buffer.
enum Request {
    AverageF32(Vec<f32>),
    SumF64(Vec<f64>),
    Broadcast(Vec<f32>, usize),
}

enum Reply {
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// A communicator living on its own thread. Requests run in submission
/// order and replies come back in that order, so every rank issues the
/// same sequence of collectives, as the transports require.
pub struct CommThread {
    rank: usize,
    world_size: usize,
    requests: Option<Sender<Request>>,
    replies: Receiver<Result<Reply, CommError>>,
    pending: usize,
    thread: Option<JoinHandle<()>>,
}

impl CommThread {
    pub fn spawn(mut comm: Box<dyn Communicator>) -> anyhow::Result<Self> {
        let (rank, world_size) = (comm.rank(), comm.world_size());
        let (requests, inbox) = channel::<Request>();
        let (outbox, replies) = channel();
        let thread = std::thread::Builder::new()
            .name(format!("comm-rank{rank}"))
            .spawn(move || {
                for request in inbox {
                    let reply = match request {
                        Request::AverageF32(mut buf) => comm
                            .all_reduce(&mut buf, ReduceOp::Avg)
                            .map(|()| Reply::F32(buf)),
                        Request::SumF64(mut buf) => comm
                            .all_reduce_f64(&mut buf, ReduceOp::Sum)
                            .map(|()| Reply::F64(buf)),
                        Request::Broadcast(mut buf, root) => {
                            comm.broadcast(&mut buf, root).map(|()| Reply::F32(buf))
                        }
                    };
                    let failed = reply.is_err();
                    if outbox.send(reply).is_err() || failed {
                        // After a failed collective the ring is out of step
                        // for good; stop and let the trainer report it.
                        break;
                    }
                }
            })
            .context("starting the communication thread")?;
        Ok(Self {
            rank,
            world_size,
            requests: Some(requests),
            replies,
            pending: 0,
            thread: Some(thread),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    fn submit(&mut self, request: Request) -> anyhow::Result<()> {
        let sent = self
            .requests
            .as_ref()
            .is_some_and(|s| s.send(request).is_ok());
        if !sent {
            return Err(self.why_stopped());
        }
        self.pending += 1;
        Ok(())
    }

    /// The thread only stops after a failed collective whose error may still
    /// wait, unread, behind earlier replies: report that error.
    fn why_stopped(&mut self) -> anyhow::Error {
        let failure = self.replies.try_iter().find_map(Result::err);
        self.pending = 0;
        let context = format!("rank {} of {}", self.rank, self.world_size);
        match failure {
            Some(e) => anyhow::Error::new(e).context(context),
            None => anyhow!("{context}: the communication thread has stopped"),
        }
    }

    fn next_reply(&mut self) -> anyhow::Result<Reply> {
        let reply = self
            .replies
            .recv()
            .map_err(|_| anyhow!("rank {}: the communication thread has stopped", self.rank))?;
        self.pending -= 1;
        reply.with_context(|| format!("rank {} of {}", self.rank, self.world_size))
    }

    fn next_f32(&mut self) -> anyhow::Result<Vec<f32>> {
        match self.next_reply()? {
            Reply::F32(v) => Ok(v),
            Reply::F64(_) => unreachable!("replies come back in request order"),
        }
    }

    /// Overwrites `buf` with rank `root`'s copy.
    pub fn broadcast(&mut self, buf: &mut Vec<f32>, root: usize) -> anyhow::Result<()> {
        self.submit(Request::Broadcast(std::mem::take(buf), root))?;
        *buf = self.next_f32()?;
        Ok(())
    }

    /// Sums `values` over all ranks (exactly, in f64).
    pub fn sum_f64(&mut self, values: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        self.submit(Request::SumF64(values))?;
        match self.next_reply()? {
            Reply::F64(v) => Ok(v),
            Reply::F32(_) => unreachable!("replies come back in request order"),
        }
    }
}

impl Drop for CommThread {
    fn drop(&mut self) {
        self.requests = None;
        // Only wait for a thread with nothing in flight: one blocked on a
        // dead peer must not keep this rank from exiting with its error.
        if self.pending == 0
            && let Some(thread) = self.thread.take()
        {
            let _ = thread.join();
        }
    }
}

/// The bucket plan: ranges of the flat gradient buffer, in the order
/// backward completes them (from the end of the buffer to the start).
pub fn plan_buckets(layout: &FlatLayout, bucket_mb: f64) -> Vec<Range<usize>> {
    let cap_bytes = (bucket_mb * 1024.0 * 1024.0).max(1.0) as usize;
    let mut buckets = Vec::new();
    let mut end = layout.len();
    let mut bytes = 0;
    for view in layout.views().iter().rev() {
        bytes += view.range.len() * 4;
        let cap = if buckets.is_empty() {
            FIRST_BUCKET_BYTES.min(cap_bytes)
        } else {
            cap_bytes
        };
        if bytes >= cap {
            buckets.push(view.range.start..end);
            end = view.range.start;
            bytes = 0;
        }
    }
    if end > 0 {
        buckets.push(0..end);
    }
    buckets
}

/// Averages gradients across ranks, bucket by bucket, overlapped with
/// backward. Used through [`GradsReady`] during backward, then [`finish`].
///
/// [`finish`]: GradientAverager::finish
pub struct GradientAverager {
    comm: CommThread,
    buckets: Vec<Range<usize>>,
    /// Host staging buffers, one per bucket, reused every step.
    staging: Vec<Vec<f32>>,
    launched: usize,
}

impl GradientAverager {
    pub fn new(comm: CommThread, layout: &FlatLayout, bucket_mb: f64) -> Self {
        let buckets = plan_buckets(layout, bucket_mb);
        let staging = buckets.iter().map(|b| vec![0.0; b.len()]).collect();
        Self {
            comm,
            buckets,
            staging,
            launched: 0,
        }
    }

    pub fn comm(&mut self) -> &mut CommThread {
        &mut self.comm
    }

    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// Waits for every bucket and writes the averaged gradients back.
    pub fn finish<B: Ops>(
        &mut self,
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
            let averaged = self.comm.next_f32()?;
            backend.write_range(&averaged, grads, self.buckets[i].start)?;
            self.staging[i] = averaged;
        }
        self.launched = 0;
        Ok(())
    }
}

impl<B: Ops> GradsReady<B> for GradientAverager {
    fn ready(&mut self, backend: &B, grads: &B::Storage<f32>, offset: usize) -> anyhow::Result<()> {
        while let Some(bucket) = self
            .buckets
            .get(self.launched)
            .filter(|b| b.start >= offset)
        {
            let mut staging = std::mem::take(&mut self.staging[self.launched]);
            backend.read_range(grads, bucket.clone(), &mut staging)?;
            self.comm.submit(Request::AverageF32(staging))?;
            self.launched += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CnnMnist, DropoutRates};

    #[test]
    fn buckets_follow_pytorchs_rule_and_cover_the_buffer() {
        let model = CnnMnist::new(DropoutRates::REFERENCE);
        let layout = model.layout();
        let fc1 = layout.range("fc1.weight").unwrap().start;
        // fc2 and fc1.bias are only 5.6 kB; fc1.weight pushes the first
        // bucket past 1 MiB and closes it; the rest fits in one 25 MB bucket.
        assert_eq!(plan_buckets(layout, 25.0), vec![fc1..layout.len(), 0..fc1]);
        // Tiny caps give one bucket per parameter, still contiguous.
        let tiny = plan_buckets(layout, 1e-6);
        assert_eq!(tiny.len(), layout.views().len());
        assert_eq!(tiny.first().unwrap().end, layout.len());
        assert_eq!(tiny.last().unwrap().start, 0);
        assert!(tiny.windows(2).all(|w| w[0].start == w[1].end));
    }
}
