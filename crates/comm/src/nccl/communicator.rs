//! [`NcclCommunicator`]: collectives on device buffers, one process per GPU.

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nccl::sys::{ncclDataType_t, ncclRedOp_t};

use super::ffi::{self, CallError, Progress, RawComm};
use super::unique_id::exchange_unique_id;
use super::watchdog::{self, Failure, InFlight, Shared, cuda_error, nccl_error};
use crate::communicator::{HalfFormat, IntReduce, ReduceOp, check_peers, check_root};
use crate::error::CommError;
use crate::flight::{FlightLog, Kind, Label, Recorder};
use crate::nccl_library::{SearchRoots, search};
use crate::store::Store;

/// The element type of every collective but the 16-bit all-reduce.
const F32: ncclDataType_t = ncclDataType_t::ncclFloat32;

/// Pause between looks at a non-blocking NCCL call or a queued collective
/// the caller waits for.
const SPIN: Duration = Duration::from_micros(50);

/// Fails with the search report unless `libnccl.so` can be loaded; returns
/// the library's version.
pub fn require_nccl() -> Result<(u32, u32, u32), CommError> {
    if !ffi::library_present() {
        return Err(CommError::NcclMissing(search(&SearchRoots::from_env())));
    }
    ffi::version().map_err(|e| CommError::Nccl {
        rank: 0,
        op: "ncclGetVersion".into(),
        code: e.code,
        detail: e.detail,
    })
}

/// One rank's NCCL communicator, bound to the communication stream it was
/// created with: every collective is queued on that stream and returns at
/// once (the caller orders it against its compute stream with events).
///
/// A watchdog thread aborts the communicator when a collective takes longer
/// than the timeout or NCCL reports an asynchronous error; the next call
/// then returns that error, naming this rank and the collective. Every
/// collective goes through its flight [`Recorder`] (named as the
/// communicator): queued when queued, started and done as the CUDA events
/// recorded around it on the stream complete, which the watchdog sees.
pub struct NcclCommunicator {
    rank: usize,
    world_size: usize,
    stream: Arc<CudaStream>,
    shared: Arc<Shared>,
    watchdog: Option<JoinHandle<()>>,
    /// One element for [`NcclCommunicator::barrier`].
    token: Mutex<CudaSlice<f32>>,
}

impl std::fmt::Debug for NcclCommunicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCommunicator")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl NcclCommunicator {
    /// Creates this rank's communicator on `stream`'s GPU. Rank 0 makes the
    /// unique id and publishes it in `store`, the others read it there
    /// (`store` may be `None` only at world size 1). Initialisation and a
    /// first barrier must finish within `timeout`, which also bounds every
    /// later collective.
    pub fn connect(
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        store: Option<&mut Store>,
        timeout: Duration,
    ) -> Result<Self, CommError> {
        Self::connect_named(stream, rank, world_size, store, timeout, "gradients")
    }

    /// [`NcclCommunicator::connect`] for one of several communicators of a
    /// job (a sub-group: the ranks of one pipeline, or one stage's
    /// replicas): `name` keys its unique id in the store, and `rank` and
    /// `world_size` are this rank's place in the group. Every member
    /// passes the same name; distinct groups pass distinct names.
    pub fn connect_named(
        stream: Arc<CudaStream>,
        rank: usize,
        world_size: usize,
        store: Option<&mut Store>,
        timeout: Duration,
        name: &str,
    ) -> Result<Self, CommError> {
        if rank >= world_size {
            return Err(CommError::InvalidConfig(format!(
                "rank {rank} is out of range for world size {world_size}"
            )));
        }
        require_nccl()?;
        let make_id = || ffi::unique_id().map_err(|e| nccl_error(rank, "ncclGetUniqueId", e));
        let id = match store {
            Some(store) => exchange_unique_id(store, rank, name, make_id)?,
            None if world_size == 1 => make_id()?,
            None => {
                return Err(CommError::InvalidConfig(
                    "a NCCL communicator of several ranks needs the rendezvous store".into(),
                ));
            }
        };
        let ctx = stream.context().clone();
        // NCCL binds the communicator to the calling thread's current device.
        ctx.bind_to_thread()
            .map_err(|e| cuda_error(rank, "selecting the GPU", e))?;
        let op = "ncclCommInitRankConfig";
        let raw = RawComm::init(world_size, &id, rank).map_err(|e| nccl_error(rank, op, e))?;
        let deadline = Instant::now() + timeout;
        if let Err(failure) = settle(&raw, op, deadline, timeout) {
            raw.abort();
            return Err(failure.to_error(rank));
        }
        let token = match stream.alloc_zeros(1) {
            Ok(token) => token,
            Err(e) => {
                raw.abort();
                return Err(cuda_error(rank, "allocating the barrier token", e));
            }
        };
        let recorder = Recorder::new(name, rank, world_size);
        let shared = Arc::new(Shared::new(rank, timeout, raw, recorder));
        let watchdog = watchdog::spawn(shared.clone(), ctx).map_err(|e| {
            shared.close();
            CommError::io("starting the NCCL watchdog thread", e)
        })?;
        let comm = NcclCommunicator {
            rank,
            world_size,
            stream,
            shared,
            watchdog: Some(watchdog),
            token: Mutex::new(token),
        };
        comm.barrier()?;
        Ok(comm)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// The stream every collective is queued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// This communicator's flight recorder.
    pub fn recorder(&self) -> &Arc<Recorder> {
        &self.shared.recorder
    }

    /// Has the watchdog dump `log` before it ends the process (the training
    /// thread not returning after an abort), the last word this rank says.
    pub fn dump_before_exit(&self, log: FlightLog) {
        self.shared.dump_before_exit(log);
    }

    /// Queues an in-place all-reduce of `buf` on the communication stream
    /// and returns at once, reduced as `how` says for its element type
    /// ([`Reduction`]: float32 sums or means, 16-bit floats in their own
    /// type, exact i64); `what` names it in errors (e.g. "all-reduce of
    /// gradient bucket 2"), and may give its bucket to the flight record
    /// ([`Label::bucket`]). For the right values the caller makes the stream
    /// wait for whatever wrote `buf`, and makes its readers wait for the
    /// stream.
    ///
    /// # Safety
    /// NCCL reads and writes `buf` on the communication stream after this
    /// returns. Until that stream has completed the collective (see
    /// [`NcclCommunicator::wait`], or an event recorded on
    /// [`NcclCommunicator::stream`]), the caller keeps `buf` alive: not freed,
    /// and not reused or written by work on another stream.
    pub unsafe fn all_reduce_in_place<'a, T>(
        &self,
        buf: &mut impl DevicePtrMut<T>,
        how: impl Reduction<T>,
        what: impl Into<Label<'a>>,
    ) -> Result<(), CommError> {
        let count = buf.len();
        let (dtype, op) = how.nccl();
        let bytes = size_of::<T>() * count;
        let (ptr, _record) = buf.device_ptr_mut(&self.stream);
        self.enqueue((what.into(), Kind::AllReduce, bytes), |comm| {
            // SAFETY: `ptr` addresses `count` elements of `T` (NCCL's `dtype`
            // for it, by `Reduction`'s contract) of a live device buffer on
            // this stream's GPU, which the caller keeps alive and unshared
            // until the stream has completed the collective (this function's
            // contract).
            unsafe { comm.all_reduce((ptr, ptr, count), dtype, op, &self.stream) }
        })
    }

    /// Queues an all-reduce of `send` into `recv` (of the same length) and
    /// returns at once, leaving `send` as it was; as
    /// [`NcclCommunicator::all_reduce_in_place`] otherwise.
    ///
    /// # Safety
    /// As for [`NcclCommunicator::all_reduce_in_place`], for both buffers:
    /// until the communication stream has completed the collective, neither
    /// is freed, and no other stream writes `send` or uses `recv`.
    pub unsafe fn all_reduce<'a>(
        &self,
        send: &impl DevicePtr<f32>,
        recv: &mut impl DevicePtrMut<f32>,
        op: ReduceOp,
        what: impl Into<Label<'a>>,
    ) -> Result<(), CommError> {
        let count = send.len();
        if recv.len() != count {
            return Err(CommError::InvalidArgument {
                op: "all_reduce",
                reason: format!("send holds {count} elements but recv {}", recv.len()),
            });
        }
        let (src, _record_src) = send.device_ptr(&self.stream);
        let (dst, _record_dst) = recv.device_ptr_mut(&self.stream);
        self.enqueue((what.into(), Kind::AllReduce, 4 * count), |comm| {
            // SAFETY: both address `count` f32 of live device buffers on this
            // stream's GPU (distinct borrows, so disjoint), kept alive and
            // unshared by the caller until the collective completes (this
            // function's contract).
            unsafe { comm.all_reduce((src, dst, count), F32, nccl_op(op), &self.stream) }
        })
    }

    /// Queues an in-place broadcast of rank `root`'s `buf` to every rank and
    /// returns at once; as [`NcclCommunicator::all_reduce_in_place`]
    /// otherwise.
    ///
    /// # Safety
    /// As for [`NcclCommunicator::all_reduce_in_place`]: until the
    /// communication stream has completed the broadcast, the caller keeps
    /// `buf` alive, not freed, reused or written by another stream.
    pub unsafe fn broadcast_in_place<'a>(
        &self,
        buf: &mut impl DevicePtrMut<f32>,
        root: usize,
        what: impl Into<Label<'a>>,
    ) -> Result<(), CommError> {
        check_root(root, self.world_size)?;
        let count = buf.len();
        let (ptr, _record) = buf.device_ptr_mut(&self.stream);
        self.enqueue((what.into(), Kind::Broadcast, 4 * count), |comm| {
            // SAFETY: as in `all_reduce_in_place`.
            unsafe { comm.broadcast_f32(ptr, count, root, &self.stream) }
        })
    }

    /// Queues, as one NCCL group, a send of `send.0` to rank `send.1` and a
    /// receive into `recv.0` from rank `recv.1` (either may be `None`) on
    /// the communication stream, and returns at once; the peer must queue
    /// the matching receive and send (same lengths). As
    /// [`NcclCommunicator::all_reduce_in_place`] otherwise.
    ///
    /// # Safety
    /// As for [`NcclCommunicator::all_reduce_in_place`], for both buffers:
    /// until the communication stream has completed the exchange, neither
    /// is freed, and no other stream writes `send` or uses `recv`.
    pub unsafe fn send_recv<'a>(
        &self,
        send: Option<(&impl DevicePtr<f32>, usize)>,
        recv: Option<(&mut impl DevicePtrMut<f32>, usize)>,
        what: impl Into<Label<'a>>,
    ) -> Result<(), CommError> {
        let peers = [send.as_ref().map(|s| s.1), recv.as_ref().map(|r| r.1)];
        check_peers(self.rank, self.world_size, peers)?;
        let send = send.map(|(buf, peer)| {
            let (ptr, record) = buf.device_ptr(&self.stream);
            (
                ffi::PeerBuf {
                    ptr,
                    count: buf.len(),
                    peer,
                },
                record,
            )
        });
        let recv = recv.map(|(buf, peer)| {
            let count = buf.len();
            let (ptr, record) = buf.device_ptr_mut(&self.stream);
            (ffi::PeerBuf { ptr, count, peer }, record)
        });
        let (to, from) = (send.as_ref().map(|s| s.0), recv.as_ref().map(|r| r.0));
        let bytes = 4 * (to.map_or(0, |b| b.count) + from.map_or(0, |b| b.count));
        self.enqueue((what.into(), Kind::SendRecv, bytes), |comm| {
            // SAFETY: each addresses its `count` f32 of a live device buffer
            // on this stream's GPU (distinct borrows, so disjoint), kept
            // alive and unshared by the caller until the exchange completes
            // (this function's contract).
            unsafe { comm.send_recv_f32(to, from, &self.stream) }
        })
    }

    /// Returns once every rank has reached the barrier and every collective
    /// queued before it has completed here.
    pub fn barrier(&self) -> Result<(), CommError> {
        {
            let mut token = self.token.lock().unwrap_or_else(PoisonError::into_inner);
            let (ptr, _record) = token.device_ptr_mut(&self.stream);
            self.enqueue(("barrier".into(), Kind::Barrier, 4), |comm| {
                // SAFETY: the token belongs to `self` and only this stream
                // uses it; it was allocated on this stream, so even its
                // free (when `self` drops) is queued behind the collective.
                unsafe { comm.all_reduce((ptr, ptr, 1), F32, ncclRedOp_t::ncclSum, &self.stream) }
            })?;
        }
        self.wait()
    }

    /// Blocks until every queued collective has completed (or failed).
    pub fn wait(&self) -> Result<(), CommError> {
        loop {
            self.check()?;
            match self.shared.idle() {
                // Collectives also "complete" when an abort stops them; the
                // watchdog records why before it aborts, so look again. One
                // that a peer's failure ended (its process gone) completes
                // too, its results unwritten, before the watchdog's next
                // look: ask NCCL itself before the caller reads them.
                Ok(true) => match self.shared.async_failure() {
                    Some(failure) => return Err(self.shared.fail_and_report(failure)),
                    None => return self.check(),
                },
                Ok(false) => std::thread::sleep(SPIN),
                Err(failure) => return Err(self.shared.fail_and_report(failure)),
            }
        }
    }

    /// The failure the watchdog found, if any; cheap, for every step.
    pub fn check(&self) -> Result<(), CommError> {
        match self.shared.take_failure() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Runs one NCCL call that queues a collective (`what`, of `kind`,
    /// moving `bytes` here) between two CUDA events, waits (bounded) for a
    /// non-blocking call to finish queuing, and hands the collective to the
    /// watchdog.
    fn enqueue(
        &self,
        (what, kind, bytes): (Label<'_>, Kind, usize),
        call: impl FnOnce(&RawComm) -> Result<Progress, CallError>,
    ) -> Result<(), CommError> {
        self.check()?;
        let op = what.name;
        let seq = self.shared.recorder.queue(kind, what.bucket, bytes);
        let event = || {
            (self.stream.record_event(None)).map_err(|e| Failure::Cuda {
                op: op.to_string(),
                detail: e.to_string(),
            })
        };
        let deadline = Instant::now() + self.shared.timeout;
        // The event before completes once the stream reaches the collective.
        let queued = event().and_then(|started| {
            let called = self.shared.with_comm(|comm| {
                call(comm)
                    .map_err(|error| Failure::Nccl {
                        op: op.to_string(),
                        error,
                    })
                    .and_then(|_| settle(comm, op, deadline, self.shared.timeout))
            });
            called.unwrap_or_else(|| {
                Err(Failure::Nccl {
                    op: op.to_string(),
                    error: CallError {
                        code: "aborted".into(),
                        detail: "the communicator was aborted after an earlier failure".into(),
                        remote: false,
                    },
                })
            })?;
            Ok(InFlight {
                started: Some(started),
                done: event()?,
                op: op.to_string(),
                since: Instant::now(),
                seq,
            })
        });
        let inflight = queued.map_err(|failure| self.shared.fail_and_report(failure))?;
        self.shared.push(inflight);
        Ok(())
    }
}

impl Drop for NcclCommunicator {
    /// Lets queued collectives finish (bounded by the timeout), stops the
    /// watchdog, and frees the communicator.
    fn drop(&mut self) {
        let deadline = Instant::now() + self.shared.timeout;
        while matches!(self.shared.idle(), Ok(false)) && Instant::now() < deadline {
            std::thread::sleep(SPIN);
        }
        self.shared.stop();
        if let Some(watchdog) = self.watchdog.take() {
            let _ = watchdog.join();
        }
        // Aborting an idle communicator only frees it; a busy one (a peer
        // hung at shutdown) is stopped rather than waited for.
        self.shared.close();
    }
}

/// Waits until a non-blocking call on `comm` has finished, or fails at
/// `deadline`.
fn settle(comm: &RawComm, op: &str, deadline: Instant, timeout: Duration) -> Result<(), Failure> {
    loop {
        match comm.async_error() {
            Ok(Progress::Done) => return Ok(()),
            Ok(Progress::InProgress) if Instant::now() < deadline => std::thread::sleep(SPIN),
            Ok(Progress::InProgress) => {
                return Err(Failure::Timeout {
                    op: op.to_string(),
                    timeout,
                });
            }
            Err(error) => {
                return Err(Failure::Nccl {
                    op: op.to_string(),
                    error,
                });
            }
        }
    }
}

fn nccl_op(op: ReduceOp) -> ncclRedOp_t {
    match op {
        ReduceOp::Sum => ncclRedOp_t::ncclSum,
        ReduceOp::Avg => ncclRedOp_t::ncclAvg,
    }
}

/// How an all-reduce of elements of `T` reduces them: NCCL's type for `T`'s
/// bits and its operation.
///
/// # Safety
/// The type `nccl` names is `T`'s size: NCCL reads and writes `count`
/// elements of it where the buffer holds `count` of `T`.
pub unsafe trait Reduction<T> {
    fn nccl(self) -> (ncclDataType_t, ncclRedOp_t);
}

/// Float32 sums or means.
// SAFETY: ncclFloat32 is an f32.
unsafe impl Reduction<f32> for ReduceOp {
    fn nccl(self) -> (ncclDataType_t, ncclRedOp_t) {
        (F32, nccl_op(self))
    }
}

/// 16-bit floats (`--comm-hook bf16|fp16` over NCCL; `u16` holds their
/// bits), which NCCL reduces in their own type: half float32's bytes.
// SAFETY: ncclBfloat16 and ncclFloat16 are two bytes, as a u16.
unsafe impl Reduction<u16> for (ReduceOp, HalfFormat) {
    fn nccl(self) -> (ncclDataType_t, ncclRedOp_t) {
        let dtype = match self.1 {
            HalfFormat::Bf16 => ncclDataType_t::ncclBfloat16,
            HalfFormat::Fp16 => ncclDataType_t::ncclFloat16,
        };
        (dtype, nccl_op(self.0))
    }
}

/// Two's complement i64 summed wrapping or maximised (`--reproducible`'s
/// sums and scales), which no order or grouping of the ranks changes.
// SAFETY: ncclInt64 is an i64.
unsafe impl Reduction<i64> for IntReduce {
    fn nccl(self) -> (ncclDataType_t, ncclRedOp_t) {
        let op = match self {
            IntReduce::Sum => ncclRedOp_t::ncclSum,
            IntReduce::Max => ncclRedOp_t::ncclMax,
        };
        (ncclDataType_t::ncclInt64, op)
    }
}
