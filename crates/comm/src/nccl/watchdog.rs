//! The watchdog: a thread that watches every queued NCCL collective and the
//! communicator's asynchronous error state, and aborts the communicator when
//! a collective outlives the timeout or NCCL reports a failure (a peer died,
//! the network broke). The abort makes the hung kernels return, so the
//! training thread, whatever it waits on, wakes up and reports the failure
//! on its next call (`Shared::take_failure`).
//!
//! Should the training thread still not report it within another timeout
//! (it is stuck somewhere the abort cannot reach), the watchdog prints the
//! error and ends the process: a rank must fail, never hang. PyTorch's NCCL
//! watchdog does the same.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaEvent};

use super::ffi::{CallError, RawComm};
use crate::error::CommError;
use crate::flight::{FlightLog, Recorder};

/// How often the watchdog looks.
const POLL: Duration = Duration::from_millis(1);

/// A queued collective: the events before it (`None` once seen complete)
/// and after it, when it was queued, and its flight record's number.
pub(crate) struct InFlight {
    pub started: Option<CudaEvent>,
    pub done: CudaEvent,
    pub op: String,
    pub since: Instant,
    pub seq: u64,
}

/// Why the communicator is no longer usable.
#[derive(Debug, Clone)]
pub(crate) enum Failure {
    /// A collective did not complete within the timeout.
    Timeout { op: String, timeout: Duration },
    /// NCCL reported an error, synchronously or asynchronously.
    Nccl { op: String, error: CallError },
    /// A CUDA call around the collectives (events) failed.
    Cuda { op: String, detail: String },
}

impl Failure {
    pub(crate) fn to_error(&self, rank: usize) -> CommError {
        match self.clone() {
            Failure::Timeout { op, timeout } => CommError::NcclTimeout { rank, op, timeout },
            Failure::Nccl { op, error } if error.remote => CommError::NcclPeerLost {
                rank,
                op,
                code: error.code,
                detail: error.detail,
            },
            Failure::Nccl { op, error } => CommError::Nccl {
                rank,
                op,
                code: error.code,
                detail: error.detail,
            },
            Failure::Cuda { op, detail } => CommError::Cuda { rank, op, detail },
        }
    }
}

/// NCCL's error `e` in `op` on `rank`, as the caller's.
pub(crate) fn nccl_error(rank: usize, op: &str, e: CallError) -> CommError {
    Failure::Nccl {
        op: op.to_string(),
        error: e,
    }
    .to_error(rank)
}

/// The CUDA driver's error `e` in `op` on `rank`, as the caller's.
pub(crate) fn cuda_error(rank: usize, op: &str, e: cudarc::driver::DriverError) -> CommError {
    CommError::Cuda {
        rank,
        op: op.to_string(),
        detail: e.to_string(),
    }
}

/// State shared by the communicator and its watchdog.
pub(crate) struct Shared {
    pub rank: usize,
    pub timeout: Duration,
    /// `None` once aborted.
    comm: Mutex<Option<RawComm>>,
    inflight: Mutex<VecDeque<InFlight>>,
    failure: Mutex<Option<Failure>>,
    reported: AtomicBool,
    stop: AtomicBool,
    pub recorder: Arc<Recorder>,
    /// Dumped before the watchdog ends the process.
    flight_log: OnceLock<FlightLog>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves the data consistent, so a panic in one
    // (there are none by design) must not wedge the others.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn new(
        rank: usize,
        timeout: Duration,
        comm: RawComm,
        recorder: Arc<Recorder>,
    ) -> Self {
        Shared {
            rank,
            timeout,
            comm: Mutex::new(Some(comm)),
            inflight: Mutex::new(VecDeque::new()),
            failure: Mutex::new(None),
            reported: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            recorder,
            flight_log: OnceLock::new(),
        }
    }

    pub(crate) fn dump_before_exit(&self, log: FlightLog) {
        let _ = self.flight_log.set(log);
    }

    /// Runs `f` on the live communicator; `None` once it was aborted.
    pub(crate) fn with_comm<R>(&self, f: impl FnOnce(&RawComm) -> R) -> Option<R> {
        lock(&self.comm).as_ref().map(f)
    }

    pub(crate) fn push(&self, inflight: InFlight) {
        lock(&self.inflight).push_back(inflight);
    }

    /// Whether every queued collective has completed (retiring those that
    /// have, and recording which have started). After a failure the events
    /// complete because the abort stopped the work: the flight record keeps
    /// what it saw before.
    pub(crate) fn idle(&self) -> Result<bool, Failure> {
        let mut queue = lock(&self.inflight);
        let recorder = match lock(&self.failure).is_some() {
            true => None,
            false => Some(&self.recorder),
        };
        for queued in queue.iter_mut() {
            let Some(started) = &queued.started else {
                continue;
            };
            // Streams run in order: the first not started ends the look.
            match started.try_is_complete() {
                Ok(true) => {
                    if let Some(recorder) = recorder {
                        recorder.start(queued.seq);
                    }
                    queued.started = None;
                }
                Ok(false) => break,
                Err(e) => {
                    return Err(Failure::Cuda {
                        op: queued.op.clone(),
                        detail: e.to_string(),
                    });
                }
            }
        }
        while let Some(front) = queue.front() {
            match front.done.try_is_complete() {
                Ok(true) => {
                    if let Some(recorder) = recorder {
                        recorder.finish(front.seq);
                    }
                    queue.pop_front();
                }
                Ok(false) => return Ok(false),
                Err(e) => {
                    return Err(Failure::Cuda {
                        op: front.op.clone(),
                        detail: e.to_string(),
                    });
                }
            }
        }
        Ok(true)
    }

    /// Records the first failure and aborts the communicator.
    pub(crate) fn fail(&self, failure: Failure) {
        lock(&self.failure).get_or_insert(failure);
        self.close();
    }

    /// [`Shared::fail`], returning the first failure as the caller's error.
    pub(crate) fn fail_and_report(&self, failure: Failure) -> CommError {
        let first = lock(&self.failure).get_or_insert(failure).clone();
        self.close();
        self.reported.store(true, Ordering::Release);
        first.to_error(self.rank)
    }

    /// Aborts the communicator (which frees it); later calls find none.
    pub(crate) fn close(&self) {
        if let Some(comm) = lock(&self.comm).take() {
            comm.abort();
        }
    }

    /// The failure, if any, as the error the caller reports; once taken,
    /// the watchdog knows the failure reached the training thread.
    pub(crate) fn take_failure(&self) -> Option<CommError> {
        let failure = lock(&self.failure).clone()?;
        self.reported.store(true, Ordering::Release);
        Some(failure.to_error(self.rank))
    }

    /// One look: retire finished collectives, then abort on an overdue one
    /// or an asynchronous NCCL error.
    fn inspect(&self) {
        if let Err(failure) = self.idle() {
            return self.fail(failure);
        }
        let overdue = lock(&self.inflight)
            .front()
            .filter(|f| f.since.elapsed() > self.timeout)
            .map(|f| f.op.clone());
        if let Some(op) = overdue {
            return self.fail(Failure::Timeout {
                op,
                timeout: self.timeout,
            });
        }
        if let Some(failure) = self.async_failure() {
            self.fail(failure);
        }
    }

    /// NCCL's asynchronous error, if it reports one, as the failure of the
    /// oldest collective in flight (or of the communicator, none being).
    pub(crate) fn async_failure(&self) -> Option<Failure> {
        let Some(Err(error)) = self.with_comm(RawComm::async_error) else {
            return None;
        };
        let op = lock(&self.inflight)
            .front()
            .map_or_else(|| "the communicator".to_string(), |f| f.op.clone());
        Some(Failure::Nccl { op, error })
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Starts the watchdog of `shared` on a thread bound to `ctx`.
pub(crate) fn spawn(shared: Arc<Shared>, ctx: Arc<CudaContext>) -> std::io::Result<JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("nccl-watchdog-rank{}", shared.rank))
        .spawn(move || {
            if let Err(e) = ctx.bind_to_thread() {
                shared.fail(Failure::Cuda {
                    op: "starting the NCCL watchdog".into(),
                    detail: e.to_string(),
                });
            }
            let mut failed_at = None;
            while !shared.stop.load(Ordering::Acquire) {
                std::thread::sleep(POLL);
                if failed_at.is_none() {
                    shared.inspect();
                    if lock(&shared.failure).is_some() {
                        failed_at = Some(Instant::now());
                    }
                    continue;
                }
                let unreported = !shared.reported.load(Ordering::Acquire);
                if unreported && failed_at.is_some_and(|t: Instant| t.elapsed() > shared.timeout) {
                    if let Some(error) = shared.take_failure() {
                        let error = format!(
                            "{error}; the training thread did not return after the abort, \
                             so the process exits"
                        );
                        if let Some(log) = shared.flight_log.get() {
                            let _ = log.dump(&error);
                        }
                        eprintln!("error: {error}");
                    }
                    std::process::exit(1);
                }
            }
        })
}
