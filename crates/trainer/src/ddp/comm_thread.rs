//! [`CommThread`]: the host communicator on its own thread, so collectives
//! run while the training thread computes.

use std::ops::DerefMut;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;

use anyhow::{Context, anyhow};
use comm::{CommError, Communicator, ReduceOp};

/// A host buffer of gradients in flight to the communication thread and
/// back: a backend's staging buffer (page-locked for a GPU), type-erased so
/// the thread serves every backend.
pub(super) type Staged = Box<dyn DerefMut<Target = [f32]> + Send>;

/// A collective for the communication thread, carrying its buffer.
pub(super) enum Request {
    AverageF32(Staged),
    SumF64(Vec<f64>),
    Broadcast(Vec<f32>, usize),
}

enum Reply {
    F32(Vec<f32>),
    Staged(Staged),
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
                            .map(|()| Reply::Staged(buf)),
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

    pub(super) fn submit(&mut self, request: Request) -> anyhow::Result<()> {
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
            _ => Err(out_of_order()),
        }
    }

    /// The next reply, which must be an averaged [`Staged`] buffer.
    pub(super) fn next_staged(&mut self) -> anyhow::Result<Staged> {
        match self.next_reply()? {
            Reply::Staged(v) => Ok(v),
            _ => Err(out_of_order()),
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
            _ => Err(out_of_order()),
        }
    }
}

/// Replies come back in request order and every caller takes the reply of
/// its own request, so a reply of another kind is a bug here.
fn out_of_order() -> anyhow::Error {
    anyhow!("internal error: the communication thread's replies are out of order")
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
