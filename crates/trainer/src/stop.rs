//! Stop requests: what a signal asks of a run.
//!
//! SIGUSR2 asks for no stop: every rank of the process writes its flight
//! record (`comm::flight`) and goes on.
//!
//! A worker turns SIGTERM and SIGUSR1 (what SLURM, systemd and schedulers
//! send before they take the machine back) into a [`StopKind::Preempt`]
//! request that the training loop checks once per step: the ranks agree on
//! a stop step, rank 0 saves a checkpoint there and every rank exits with
//! [`PREEMPTED_EXIT_CODE`](launcher::contract::PREEMPTED_EXIT_CODE). SIGINT and SIGHUP ask to stop promptly. A second
//! signal ends the process at once (not the first one again within
//! [`DUPLICATE_WINDOW`]: the same request delivered twice), and so does any
//! signal before the training loop begins, when there is nothing to save.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use comm::flight::FlightLog;
use launcher::contract::{
    DUMP_SIGNAL, RunEnd, WORKER_SIGNALS, describe, is_preemption, set_worker_signals_blocked,
};
use signal_hook::consts::{SIGHUP, SIGINT};
use signal_hook::iterator::Signals;

/// How long a worker asked to stop promptly (SIGINT, SIGHUP) waits for the
/// training loop to stop at a step boundary before it exits from under it.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// What a stop request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopKind {
    /// SIGTERM, SIGUSR1: stop at a step the ranks agree on, save a
    /// checkpoint there, exit with [`PREEMPTED_EXIT_CODE`](launcher::contract::PREEMPTED_EXIT_CODE).
    Preempt,
    /// SIGINT, SIGHUP: stop promptly; nothing is saved.
    Interrupt,
}

impl StopKind {
    /// The request a signal makes, if it makes one.
    pub fn of_signal(signal: i32) -> Option<Self> {
        match signal {
            _ if is_preemption(signal) => Some(Self::Preempt),
            SIGINT | SIGHUP => Some(Self::Interrupt),
            _ => None,
        }
    }

    /// How a worker ends that stopped on this request: preempted (75), or
    /// interrupted with a shell's Ctrl-C code (130) for SIGHUP as well.
    pub fn run_end(self) -> RunEnd {
        match self {
            Self::Preempt => RunEnd::Preempted,
            Self::Interrupt => RunEnd::Signalled(SIGINT),
        }
    }

    fn encode(self) -> u8 {
        match self {
            Self::Preempt => 1,
            Self::Interrupt => 2,
        }
    }

    fn decode(raw: u8) -> Option<Self> {
        match raw {
            1 => Some(Self::Preempt),
            2 => Some(Self::Interrupt),
            _ => None,
        }
    }
}

/// A stop request shared between the signal handlers and the training
/// loop; cheap to clone (an `Arc`'d pair of atomics) and checked once per
/// step.
#[derive(Clone, Debug, Default)]
pub struct StopRequest(Arc<Shared>);

#[derive(Debug, Default)]
struct Shared {
    kind: AtomicU8,
    /// Whether the training loop has begun: before, a stop request has
    /// nothing to save and no step to agree on, and the process may go at
    /// once (a rank waiting out the rendezvous would not see it until then).
    training: AtomicBool,
    /// The flight logs of the process's ranks, dumped on [`DUMP_SIGNAL`].
    flight_logs: Mutex<Vec<FlightLog>>,
}

impl StopRequest {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the run to stop; the first request stands (a later one does not
    /// turn a preemption into an interruption or back).
    pub fn request(&self, kind: StopKind) {
        let _ = self
            .0
            .kind
            .compare_exchange(0, kind.encode(), Ordering::AcqRel, Ordering::Acquire);
    }

    /// What was asked, if anything: one atomic load.
    pub fn requested(&self) -> Option<StopKind> {
        StopKind::decode(self.0.kind.load(Ordering::Acquire))
    }

    /// The training loop begins: from now on a stop waits for a step.
    pub fn training_begins(&self) {
        self.0.training.store(true, Ordering::Release);
    }

    fn training(&self) -> bool {
        self.0.training.load(Ordering::Acquire)
    }

    /// Dumps `log` on [`DUMP_SIGNAL`] (SIGUSR2) from now on.
    pub fn dump_on_signal(&self, log: FlightLog) {
        self.flight_logs().push(log);
    }

    fn flight_logs(&self) -> std::sync::MutexGuard<'_, Vec<FlightLog>> {
        // A push or a clone cannot leave the list half-changed.
        self.0
            .flight_logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// Writes `log` for `reason`, saying where; a write that fails is said,
/// and changes nothing else (`reason` is the news).
pub fn dump_flight_log(log: &FlightLog, reason: &str) {
    let rank = log.rank();
    match log.dump(reason) {
        Ok(Some(path)) => tell!("rank {rank}: flight record written to {}", path.display()),
        Ok(None) => {}
        Err(e) => tell!(
            "rank {rank}: could not write its flight record to {}: {e}",
            log.path().display()
        ),
    }
}

/// How soon a repeat of a worker's first signal counts as the same request
/// delivered twice: SLURM (`scancel --signal`, `--signal=USR1@N`, a
/// requeue's SIGTERM) and systemd signal every process of a job, so a
/// worker gets the signal itself and again from its launcher, within
/// milliseconds. A person's second Ctrl-C comes later.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(2);

/// Installs this process's handlers (a worker): the first SIGTERM or
/// SIGUSR1 requests [`StopKind::Preempt`], the first SIGINT or SIGHUP
/// [`StopKind::Interrupt`] (and the process exits with 128 + signal if the
/// training loop has not stopped within [`INTERRUPT_GRACE`]); any second
/// signal exits at once with 128 + signal, except the first one again
/// within [`DUPLICATE_WINDOW`]. SIGUSR2, any number of times, dumps the
/// flight logs given to [`StopRequest::dump_on_signal`].
///
/// The handlers only feed a self-pipe; a thread of their own reads it, so
/// nothing but async-signal-safe code runs in the handlers themselves.
pub fn install_worker_handlers(stop: &StopRequest) -> anyhow::Result<()> {
    let mut signals = Signals::new(WORKER_SIGNALS).context("installing the signal handlers")?;
    // A launcher starts its workers with these blocked (see
    // `die_with_parent`), so one sent before now waits, pending, for the
    // handlers instead of killing the worker: let it through.
    set_worker_signals_blocked(libc::SIG_UNBLOCK);
    let stop = stop.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut first: Option<(i32, Instant)> = None;
            for signal in signals.forever() {
                if signal == DUMP_SIGNAL {
                    let logs = stop.flight_logs().clone();
                    logs.iter()
                        .for_each(|log| dump_flight_log(log, &describe(signal)));
                    continue;
                }
                if let Some((seen, at)) = first {
                    if seen == signal && at.elapsed() < DUPLICATE_WINDOW {
                        continue;
                    }
                    tell!("{}: stopping at once", describe(signal));
                    std::process::exit(128 + signal);
                }
                first = Some((signal, Instant::now()));
                let Some(kind) = StopKind::of_signal(signal) else {
                    continue;
                };
                if !stop.training() {
                    let code = kind.run_end().exit_code();
                    tell!(
                        "{}: stopping before training began (nothing to save); exit {code}",
                        describe(signal)
                    );
                    std::process::exit(code);
                }
                stop.request(kind);
                if kind == StopKind::Interrupt {
                    exit_after(INTERRUPT_GRACE, signal);
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Ends the process with 128 + `signal` after `grace`, unless it ends first.
fn exit_after(grace: Duration, signal: i32) {
    std::thread::spawn(move || {
        std::thread::sleep(grace);
        std::process::exit(128 + signal);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_request_stands() {
        let stop = StopRequest::new();
        assert_eq!(stop.requested(), None);
        let seen_by_the_loop = stop.clone();
        stop.request(StopKind::Preempt);
        stop.request(StopKind::Interrupt);
        assert_eq!(seen_by_the_loop.requested(), Some(StopKind::Preempt));
    }

    #[test]
    fn signals_map_to_requests_and_exit_codes() {
        use launcher::contract::PREEMPTED_EXIT_CODE;
        use signal_hook::consts::{SIGTERM, SIGUSR1, SIGUSR2};
        assert_eq!(StopKind::of_signal(SIGTERM), Some(StopKind::Preempt));
        assert_eq!(StopKind::of_signal(SIGUSR1), Some(StopKind::Preempt));
        assert_eq!(StopKind::of_signal(SIGINT), Some(StopKind::Interrupt));
        assert_eq!(StopKind::of_signal(SIGHUP), Some(StopKind::Interrupt));
        assert_eq!(StopKind::of_signal(SIGUSR2), None);
        // A worker's rule: either interruption ends it as Ctrl-C would.
        assert_eq!(StopKind::Interrupt.run_end().exit_code(), 130);
        assert_eq!(StopKind::Preempt.run_end(), RunEnd::Preempted);
        assert_eq!(PREEMPTED_EXIT_CODE, RunEnd::Preempted.exit_code());
    }
}
