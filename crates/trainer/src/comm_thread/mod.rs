//! [`CommThread`]: the host communicator on its own thread, so collectives
//! run while the training thread computes. Every collective passes its
//! flight [`Recorder`]: queued when submitted, started and done on the
//! thread.

use std::ops::DerefMut;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use anyhow::{Context, anyhow};
use comm::flight::{Kind, Recorder};
use comm::{CommError, Communicator, HalfFormat, IntReduce, ReduceOp};

/// A host buffer of gradients in flight to the communication thread and
/// back: a backend's staging buffer (page-locked for a GPU), type-erased so
/// the thread serves every backend.
pub(crate) type Staged = Box<dyn DerefMut<Target = [f32]> + Send>;

/// A way of averaging a buffer that takes several collectives and local
/// work between them (PowerSGD), run on the communication thread with its
/// state, which travels there and back with the buffer.
pub(crate) trait Reduction: Send {
    /// Overwrites `buf` with its average over the ranks of `comm`.
    fn reduce(&mut self, comm: &mut dyn Communicator, buf: &mut [f32]) -> Result<(), CommError>;

    /// The bytes of the buffers its collectives carry, for flight records.
    fn bytes(&self) -> usize;

    /// Itself, to be taken back as what it is.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

/// A collective for the communication thread, carrying its buffer (and
/// for an average, the gradient bucket it is, if one).
pub(crate) enum Op {
    AverageF32(Staged, Option<usize>),
    /// The average, carried as 16-bit floats.
    AverageHalf(Staged, HalfFormat, usize),
    /// A bucket's average by a [`Reduction`].
    Reduce(Staged, Box<dyn Reduction>, usize),
    SumF64(Vec<f64>),
    /// An exact integer reduction (`--reproducible`'s sums and scales).
    ReduceI64(Vec<i64>, IntReduce),
    Broadcast(Vec<f32>, usize),
    GatherF32(Vec<f32>),
}

impl Op {
    /// What the flight record says of it: kind, bucket, this rank's bytes.
    fn flight(&self) -> (Kind, Option<usize>, usize) {
        match self {
            Op::AverageF32(buf, bucket) => (Kind::AllReduce, *bucket, 4 * buf.len()),
            Op::AverageHalf(buf, _, bucket) => (Kind::AllReduce, Some(*bucket), 2 * buf.len()),
            Op::Reduce(_, how, bucket) => (Kind::AllReduce, Some(*bucket), how.bytes()),
            Op::SumF64(buf) => (Kind::AllReduceF64, None, 8 * buf.len()),
            Op::ReduceI64(buf, _) => (Kind::AllReduce, None, 8 * buf.len()),
            Op::Broadcast(buf, _) => (Kind::Broadcast, None, 4 * buf.len()),
            Op::GatherF32(buf) => (Kind::AllGather, None, 4 * buf.len()),
        }
    }
}

enum Reply {
    F32(Vec<f32>),
    Gathered(Vec<Vec<f32>>),
    Staged(Staged),
    Reduced(Staged, Box<dyn Reduction>),
    F64(Vec<f64>),
    I64(Vec<i64>),
}

type ReplySender = Sender<Result<Reply, CommError>>;

/// An operation, where its reply goes, and its flight record's number.
struct Request {
    op: Op,
    reply: ReplySender,
    seq: u64,
}

/// A communicator living on its own thread. Requests run in submission
/// order, whichever [`CommHandle`] submitted them, so every rank issues the
/// same sequence of collectives as long as its handles are used in one
/// program order (they are: by one training thread). Each handle receives
/// the replies of its own requests, in order.
pub struct CommThread {
    handle: CommHandle,
    thread: Option<JoinHandle<()>>,
}

/// One user's access to a [`CommThread`]: the gradient hook holds one, the
/// trainer (metrics, the starting state) another.
pub struct CommHandle {
    rank: usize,
    world_size: usize,
    requests: Sender<Request>,
    reply_to: ReplySender,
    replies: Receiver<Result<Reply, CommError>>,
    /// Requests of every handle still in flight.
    in_flight: Arc<AtomicUsize>,
    recorder: Arc<Recorder>,
    /// The first failed collective's error, for the first handle to read
    /// an error (the others read that the communicator is broken).
    failure: Arc<Mutex<Option<CommError>>>,
}

impl CommThread {
    /// The job's communicator on its thread (flight records say `job`).
    pub fn spawn(comm: Box<dyn Communicator>) -> anyhow::Result<Self> {
        Self::spawn_named(comm, "job")
    }

    /// A communicator on its thread, `group` naming it in flight records.
    pub fn spawn_named(mut comm: Box<dyn Communicator>, group: &str) -> anyhow::Result<Self> {
        let (rank, world_size) = (comm.rank(), comm.world_size());
        let recorder = Recorder::new(group, rank, world_size);
        let (requests, inbox) = channel::<Request>();
        let flight = recorder.clone();
        let failure = Arc::new(Mutex::new(None));
        let first_failure = failure.clone();
        let thread = std::thread::Builder::new()
            .name(format!("comm-rank{rank}"))
            .spawn(move || serve(comm.as_mut(), inbox, &flight, &first_failure))
            .context("starting the communication thread")?;
        let (reply_to, replies) = channel();
        Ok(Self {
            handle: CommHandle {
                rank,
                world_size,
                requests,
                reply_to,
                replies,
                in_flight: Arc::new(AtomicUsize::new(0)),
                recorder,
                failure,
            },
            thread: Some(thread),
        })
    }

    /// The flight recorder of this thread's collectives.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.handle.recorder
    }

    pub fn rank(&self) -> usize {
        self.handle.rank
    }

    pub fn world_size(&self) -> usize {
        self.handle.world_size
    }

    /// Another handle on this thread, with replies of its own.
    pub fn handle(&self) -> CommHandle {
        let (reply_to, replies) = channel();
        CommHandle {
            requests: self.handle.requests.clone(),
            in_flight: Arc::clone(&self.handle.in_flight),
            recorder: Arc::clone(&self.handle.recorder),
            failure: Arc::clone(&self.handle.failure),
            reply_to,
            replies,
            ..self.handle
        }
    }

    /// Overwrites `buf` with rank `root`'s copy.
    pub fn broadcast(&mut self, buf: &mut Vec<f32>, root: usize) -> anyhow::Result<()> {
        self.handle
            .submit(Op::Broadcast(std::mem::take(buf), root))?;
        match self.handle.next_reply()? {
            Reply::F32(v) => *buf = v,
            _ => return Err(out_of_order()),
        }
        Ok(())
    }

    /// Sums `values` over all ranks (exactly, in f64).
    pub fn sum_f64(&mut self, values: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        self.handle.sum_f64(values)
    }

    /// `values` reduced over all ranks as `op` says, exactly.
    pub fn reduce_i64(&mut self, values: Vec<i64>, op: IntReduce) -> anyhow::Result<Vec<i64>> {
        self.handle.submit(Op::ReduceI64(values, op))?;
        match self.handle.next_reply()? {
            Reply::I64(v) => Ok(v),
            _ => Err(out_of_order()),
        }
    }

    /// Every rank's `values` (lengths may differ), in rank order.
    pub fn all_gather(&mut self, values: Vec<f32>) -> anyhow::Result<Vec<Vec<f32>>> {
        self.handle.all_gather(values)
    }
}

impl CommHandle {
    pub fn world_size(&self) -> usize {
        self.world_size
    }

    pub(crate) fn submit(&mut self, op: Op) -> anyhow::Result<()> {
        let (kind, bucket, bytes) = op.flight();
        let request = Request {
            op,
            reply: self.reply_to.clone(),
            seq: self.recorder.queue(kind, bucket, bytes),
        };
        if self.requests.send(request).is_err() {
            // It serves every handle until the last is gone: it panicked.
            return Err(anyhow!(
                "rank {} of {}: the communication thread has stopped",
                self.rank,
                self.world_size
            ));
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn next_reply(&mut self) -> anyhow::Result<Reply> {
        let reply = self
            .replies
            .recv()
            .map_err(|_| anyhow!("rank {}: the communication thread has stopped", self.rank))?;
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let reply = reply.map_err(|broken| {
            let mut first = self.failure.lock().unwrap_or_else(PoisonError::into_inner);
            first.take().unwrap_or(broken)
        });
        reply.with_context(|| format!("rank {} of {}", self.rank, self.world_size))
    }

    /// Sums `values` over all ranks (exactly, in f64), waiting for it.
    pub(crate) fn sum_f64(&mut self, values: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        self.start_sum_f64(values)?;
        self.summed_f64()
    }

    /// Starts summing `values` over all ranks, in program order with this
    /// thread's other requests; [`CommHandle::summed_f64`] waits for it.
    pub(crate) fn start_sum_f64(&mut self, values: Vec<f64>) -> anyhow::Result<()> {
        self.submit(Op::SumF64(values))
    }

    /// The sum [`CommHandle::start_sum_f64`] started (the next reply).
    pub(crate) fn summed_f64(&mut self) -> anyhow::Result<Vec<f64>> {
        match self.next_reply()? {
            Reply::F64(v) => Ok(v),
            _ => Err(out_of_order()),
        }
    }

    /// Every rank's `values` (lengths may differ), in rank order.
    pub(crate) fn all_gather(&mut self, values: Vec<f32>) -> anyhow::Result<Vec<Vec<f32>>> {
        self.submit(Op::GatherF32(values))?;
        match self.next_reply()? {
            Reply::Gathered(v) => Ok(v),
            _ => Err(out_of_order()),
        }
    }

    /// The next reply, which must be an averaged [`Staged`] buffer.
    pub(crate) fn next_staged(&mut self) -> anyhow::Result<Staged> {
        match self.next_reply()? {
            Reply::Staged(v) => Ok(v),
            _ => Err(out_of_order()),
        }
    }

    /// The next reply, which must be an [`Op::Reduce`]'s buffer and state.
    pub(crate) fn next_reduced(&mut self) -> anyhow::Result<(Staged, Box<dyn Reduction>)> {
        match self.next_reply()? {
            Reply::Reduced(v, how) => Ok((v, how)),
            _ => Err(out_of_order()),
        }
    }
}

/// The communication thread's work: runs `inbox`'s requests in order
/// through `comm` and `flight`. After a failed collective the ring is out
/// of step for good: every request from then on (whichever handle waits
/// for it) is answered at once that the communicator is broken, and the
/// failure itself waits in `failure` for the first handle to read an error.
fn serve(
    comm: &mut dyn Communicator,
    inbox: Receiver<Request>,
    flight: &Recorder,
    failure: &Mutex<Option<CommError>>,
) {
    let mut broken: Option<String> = None;
    for Request { op, reply, seq } in inbox {
        if let Some(why) = &broken {
            let _ = reply.send(Err(CommError::Broken(why.clone())));
            continue;
        }
        flight.start(seq);
        let result = match op {
            Op::AverageF32(mut buf, _) => comm
                .all_reduce(&mut buf, ReduceOp::Avg)
                .map(|()| Reply::Staged(buf)),
            Op::AverageHalf(mut buf, format, _) => comm
                .all_reduce_half(&mut buf, ReduceOp::Avg, format)
                .map(|()| Reply::Staged(buf)),
            Op::Reduce(mut buf, mut how, _) => how
                .reduce(comm, &mut buf)
                .map(|()| Reply::Reduced(buf, how)),
            Op::SumF64(mut buf) => comm
                .all_reduce_f64(&mut buf, ReduceOp::Sum)
                .map(|()| Reply::F64(buf)),
            Op::ReduceI64(mut buf, op) => {
                comm.all_reduce_i64(&mut buf, op).map(|()| Reply::I64(buf))
            }
            Op::Broadcast(mut buf, root) => {
                comm.broadcast(&mut buf, root).map(|()| Reply::F32(buf))
            }
            Op::GatherF32(buf) => comm.all_gather_v(&buf).map(Reply::Gathered),
        };
        let result = result.map_err(|e| {
            let why = e.to_string();
            *failure.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
            broken = Some(why.clone());
            CommError::Broken(why)
        });
        if result.is_ok() {
            flight.finish(seq);
        }
        // A handle gone (its user failed) leaves the others waiting.
        let _ = reply.send(result);
    }
}

/// Replies come back in request order and every caller takes the reply of
/// its own request, so a reply of another kind is a bug here.
fn out_of_order() -> anyhow::Error {
    anyhow!("internal error: the communication thread's replies are out of order")
}

impl Drop for CommThread {
    fn drop(&mut self) {
        // The thread ends once every handle's sender is gone. Only wait for
        // it when this is the last handle and nothing is in flight: a
        // thread blocked on a dead peer must not keep this rank from
        // exiting with its error.
        let last = Arc::strong_count(&self.handle.in_flight) == 1;
        let idle = self.handle.in_flight.load(Ordering::Relaxed) == 0;
        let thread = self.thread.take();
        let (dummy, _) = channel();
        drop(std::mem::replace(&mut self.handle.requests, dummy));
        if last
            && idle
            && let Some(thread) = thread
        {
            let _ = thread.join();
        }
    }
}

/// Tests' two ranks on one machine, over a TCP ring of their own.
#[cfg(test)]
impl CommThread {
    /// `body` on ranks 0 and 1 of a TCP ring, each with its communicator's
    /// thread; their results in rank order.
    pub(crate) fn on_two_ranks<T: Send>(body: impl Fn(usize, CommThread) -> T + Sync) -> Vec<T> {
        use comm::{CommConfig, TcpCommunicator};
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        std::thread::scope(|s| {
            let body = &body;
            let ranks: Vec<_> = (0..2)
                .map(|rank| {
                    s.spawn(move || {
                        let config = CommConfig::new(rank, 2, "127.0.0.1", port)
                            .with_timeout(std::time::Duration::from_secs(20));
                        let comm = TcpCommunicator::connect(&config).unwrap();
                        body(rank, CommThread::spawn(Box::new(comm)).unwrap())
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use comm::flight::{Kind, State};

    use super::*;

    /// Both ranks number the same collectives alike, each queued, started
    /// and done in its flight record, with its kind, bucket and bytes.
    #[test]
    fn every_collective_passes_the_flight_recorder() {
        let records = CommThread::on_two_ranks(|rank, mut thread| {
            let mut handle = thread.handle();
            let staged: Staged = Box::new(vec![rank as f32; 10]);
            handle.submit(Op::AverageF32(staged, Some(3))).unwrap();
            handle.next_staged().unwrap();
            thread.sum_f64(vec![1.0, 2.0]).unwrap();
            let mut buf = vec![0.0; 4];
            thread.broadcast(&mut buf, 0).unwrap();
            thread.recorder().snapshot()
        });
        for (rank, record) in records.iter().enumerate() {
            assert_eq!(
                (record.group.as_str(), record.rank, record.size),
                ("job", rank, 2)
            );
            let seen: Vec<_> = (record.entries.iter())
                .map(|e| (e.seq, e.kind, e.bucket, e.bytes, e.state))
                .collect();
            assert_eq!(
                seen,
                [
                    (1, Kind::AllReduce, Some(3), 40, State::Done),
                    (2, Kind::AllReduceF64, None, 16, State::Done),
                    (3, Kind::Broadcast, None, 16, State::Done),
                ]
            );
        }
    }
}
