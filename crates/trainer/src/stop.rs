//! Stop requests: what a signal asks of a run, and how a run ended.
//!
//! A worker turns SIGTERM and SIGUSR1 (what SLURM, systemd and schedulers
//! send before they take the machine back) into a [`StopKind::Preempt`]
//! request that the training loop checks once per step: the ranks agree on
//! a stop step, rank 0 saves a checkpoint there and every rank exits with
//! [`PREEMPTED_EXIT_CODE`]. SIGINT and SIGHUP ask to stop promptly. A second
//! signal ends the process at once (not the first one again within
//! [`DUPLICATE_WINDOW`]: the same request delivered twice), and so does any
//! signal before the training loop begins, when there is nothing to save.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1};
use signal_hook::iterator::Signals;

/// The exit code of a rank (and of an srun step, and of the launcher when
/// all its workers did so) that stopped on a preemption request:
/// `EX_TEMPFAIL`, "try again later". Batch scripts requeue the job on it.
pub const PREEMPTED_EXIT_CODE: i32 = 75;

/// The exit code of a rank whose error is only that it lost a peer (comm's
/// `CommError::PeerLost`, or `PeerTimeout`: a peer that stopped
/// answering): `EX_UNAVAILABLE`. The launcher reads it to name
/// the peer's own failure first rather than this reaction to it.
pub const PEER_LOST_EXIT_CODE: i32 = 69;

/// The exit code of a rank whose error is the job's own configuration
/// ([`Misconfigured`]: a checkpoint this run may not resume): `EX_CONFIG`.
/// A restart would meet it again, so the launcher does not restart on it.
pub const MISCONFIGURED_EXIT_CODE: i32 = 78;

/// An error that no retry can mend, the job's configuration being the
/// cause; it reads as its message alone.
#[derive(Debug)]
pub struct Misconfigured(pub String);

impl std::fmt::Display for Misconfigured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Misconfigured {}

/// The exit code of a process that failed with `e`:
/// [`MISCONFIGURED_EXIT_CODE`] or [`PEER_LOST_EXIT_CODE`] when such a
/// cause is in its chain, else 1.
pub fn failure_exit_code(e: &anyhow::Error) -> i32 {
    let lost_peer = |cause: &(dyn std::error::Error + 'static)| {
        matches!(
            cause.downcast_ref(),
            Some(comm::CommError::PeerLost { .. } | comm::CommError::PeerTimeout { .. })
        )
    };
    if e.chain().any(|cause| cause.is::<Misconfigured>()) {
        MISCONFIGURED_EXIT_CODE
    } else if e.chain().any(lost_peer) {
        PEER_LOST_EXIT_CODE
    } else {
        1
    }
}

/// How long a worker asked to stop promptly (SIGINT, SIGHUP) waits for the
/// training loop to stop at a step boundary before it exits from under it.
pub const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// The signals a worker handles; the launcher forwards these and SIGUSR2.
pub const WORKER_SIGNALS: [i32; 4] = [SIGTERM, SIGUSR1, SIGINT, SIGHUP];

/// What a stop request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopKind {
    /// SIGTERM, SIGUSR1: stop at a step the ranks agree on, save a
    /// checkpoint there, exit with [`PREEMPTED_EXIT_CODE`].
    Preempt,
    /// SIGINT, SIGHUP: stop promptly; nothing is saved.
    Interrupt,
}

impl StopKind {
    /// The request a signal makes, if it makes one.
    pub fn of_signal(signal: i32) -> Option<Self> {
        match signal {
            SIGTERM | SIGUSR1 => Some(Self::Preempt),
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
}

/// How a run ended, for the process's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunEnd {
    /// Trained every epoch asked for.
    Finished,
    /// Stopped on a preemption request (after saving, when there is a
    /// checkpoint directory): exit with [`PREEMPTED_EXIT_CODE`].
    Preempted,
    /// The launcher stopped its workers because it got this signal: exit
    /// with 128 + signal, as a shell reports a process killed by it.
    Signalled(i32),
}

impl RunEnd {
    /// How a launcher ends that stops on `signal` while no worker runs
    /// (nothing to lose): a preemption for SIGTERM and SIGUSR1, the exit
    /// code batch scripts requeue on, and otherwise the signal's own 128 +
    /// signal, as when it stops its workers on it.
    pub fn stopped_early_by(signal: i32) -> RunEnd {
        match StopKind::of_signal(signal) {
            Some(StopKind::Preempt) => Self::Preempted,
            _ => Self::Signalled(signal),
        }
    }

    pub fn exit_code(self) -> i32 {
        match self {
            Self::Finished => 0,
            Self::Preempted => PREEMPTED_EXIT_CODE,
            Self::Signalled(signal) => 128 + signal,
        }
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
/// within [`DUPLICATE_WINDOW`].
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

/// Blocks (`SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) [`WORKER_SIGNALS`] for
/// the calling thread; async-signal-safe (sigemptyset, sigaddset,
/// pthread_sigmask).
fn set_worker_signals_blocked(how: libc::c_int) {
    // SAFETY: `set` is a local sigset_t initialised by sigemptyset before
    // use; pthread_sigmask reads it and writes no old mask (null).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for signal in WORKER_SIGNALS {
            libc::sigaddset(&mut set, signal);
        }
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

/// Makes the child that `command` starts die with this process, even when
/// this process is SIGKILLed: the kernel sends the child SIGKILL when its
/// parent goes (`PR_SET_PDEATHSIG`). If the parent is already gone by the
/// time the child sets that up (a race the kernel does not close), the
/// child exits before it runs anything.
///
/// The child also starts with [`WORKER_SIGNALS`] blocked (a mask survives
/// `exec`): a signal the launcher passes on in the child's first
/// milliseconds stays pending until the worker's handlers are in place
/// ([`install_worker_handlers`] unblocks them), rather than killing it
/// before it could save.
///
/// The death signal follows the *thread* that forked, so spawn from a
/// thread that lives as long as the workers (the launcher's main thread).
pub fn die_with_parent(command: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and calls
    // only async-signal-safe functions (prctl, getppid, _exit, and the
    // signal-mask calls of `set_worker_signals_blocked`); it neither
    // allocates nor takes locks.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() as u32 != parent {
                libc::_exit(128 + libc::SIGKILL);
            }
            set_worker_signals_blocked(libc::SIG_BLOCK);
            Ok(())
        });
    }
}

/// A signal's name, for messages.
pub fn describe(signal: i32) -> String {
    signal_hook::low_level::signal_name(signal)
        .map_or_else(|| format!("signal {signal}"), str::to_string)
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
        assert_eq!(StopKind::of_signal(SIGTERM), Some(StopKind::Preempt));
        assert_eq!(StopKind::of_signal(SIGUSR1), Some(StopKind::Preempt));
        assert_eq!(StopKind::of_signal(SIGINT), Some(StopKind::Interrupt));
        assert_eq!(StopKind::of_signal(SIGHUP), Some(StopKind::Interrupt));
        assert_eq!(StopKind::of_signal(signal_hook::consts::SIGUSR2), None);
        assert_eq!(RunEnd::Finished.exit_code(), 0);
        assert_eq!(RunEnd::Preempted.exit_code(), 75);
        assert_eq!(RunEnd::Signalled(SIGTERM).exit_code(), 143);
        // A launcher with no worker running: the requeue code for a
        // preemption, and the signal's own code for SIGHUP.
        assert_eq!(RunEnd::stopped_early_by(SIGUSR1).exit_code(), 75);
        assert_eq!(RunEnd::stopped_early_by(SIGHUP).exit_code(), 129);
        assert_eq!(RunEnd::stopped_early_by(SIGINT).exit_code(), 130);
        // A worker's rule: either interruption ends it as Ctrl-C would.
        assert_eq!(StopKind::Interrupt.run_end().exit_code(), 130);
        assert_eq!(StopKind::Preempt.run_end(), RunEnd::Preempted);
        assert_eq!(describe(SIGUSR1), "SIGUSR1");
    }

    /// The mask a launcher's child starts with: the worker signals blocked
    /// (bits `signal - 1` of /proc's `SigBlk`), so that they wait for its
    /// handlers.
    #[test]
    fn a_launchers_child_starts_with_the_worker_signals_blocked() {
        let mut cat = std::process::Command::new("cat");
        cat.arg("/proc/self/status");
        die_with_parent(&mut cat);
        let status = String::from_utf8(cat.output().unwrap().stdout).unwrap();
        let mask = status
            .lines()
            .find_map(|l| l.strip_prefix("SigBlk:"))
            .map(|hex| u64::from_str_radix(hex.trim(), 16).unwrap())
            .unwrap();
        for signal in WORKER_SIGNALS {
            assert_ne!(mask & (1 << (signal - 1)), 0, "signal {signal} in {mask:x}");
        }
    }
}
