//! What a launcher and its workers agree on: the exit codes a worker ends
//! with and the launcher reads, the signals a worker handles (which start
//! blocked in every worker the launcher spawns), and how a process dies
//! with its launcher; rank 0's progress records ([`progress`]).

pub mod progress;

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};

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

/// The exit code of a member of a live job (`--recovery live`) that the
/// others went on without (it hung or was stopped past their timeout):
/// it exits writing nothing, and its launcher may start a replacement.
pub const EVICTED_EXIT_CODE: i32 = 79;

/// The signals a worker handles, all of which the launcher forwards.
pub const WORKER_SIGNALS: [i32; 5] = [SIGTERM, SIGUSR1, SIGINT, SIGHUP, DUMP_SIGNAL];

/// The signal that asks a worker for its flight record (and asks nothing
/// else: it goes on).
pub const DUMP_SIGNAL: i32 = SIGUSR2;

/// An error that no retry can mend, the job's configuration being the
/// cause; it reads as its message alone.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Misconfigured(pub String);

/// The error of a member of a live job that the others went on without:
/// [`EVICTED_EXIT_CODE`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Evicted(pub String);

/// The exit code of a process that failed with `e`:
/// [`MISCONFIGURED_EXIT_CODE`] (a rendezvous open to other machines
/// without a token is one) or [`PEER_LOST_EXIT_CODE`] when such a cause is
/// in its chain of sources, else 1.
pub fn failure_exit_code(e: &(dyn std::error::Error + 'static)) -> i32 {
    let chain = || std::iter::successors(Some(e), |cause| cause.source());
    let lost_peer = |cause: &(dyn std::error::Error + 'static)| {
        matches!(
            cause.downcast_ref(),
            Some(
                comm::CommError::PeerLost { .. }
                    | comm::CommError::PeerTimeout { .. }
                    | comm::CommError::JobLost { .. }
            )
        )
    };
    let refused_open = |cause: &(dyn std::error::Error + 'static)| {
        matches!(
            cause.downcast_ref(),
            Some(comm::CommError::TokenRequired { .. })
        )
    };
    if chain().any(|cause| cause.is::<Misconfigured>() || refused_open(cause)) {
        MISCONFIGURED_EXIT_CODE
    } else if chain().any(|cause| cause.is::<Evicted>()) {
        EVICTED_EXIT_CODE
    } else if chain().any(lost_peer) {
        PEER_LOST_EXIT_CODE
    } else {
        1
    }
}

/// Whether `signal` asks a run to stop at an agreed step and save
/// (SIGTERM, SIGUSR1: what SLURM, systemd and schedulers send before they
/// take the machine back), rather than to stop promptly.
pub fn is_preemption(signal: i32) -> bool {
    matches!(signal, SIGTERM | SIGUSR1)
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
        match is_preemption(signal) {
            true => Self::Preempted,
            false => Self::Signalled(signal),
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

/// Blocks (`SIG_BLOCK`) or unblocks (`SIG_UNBLOCK`) [`WORKER_SIGNALS`] for
/// the calling thread; async-signal-safe (sigemptyset, sigaddset,
/// pthread_sigmask).
pub fn set_worker_signals_blocked(how: libc::c_int) {
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
/// (they unblock them with [`set_worker_signals_blocked`]), rather than
/// killing it before it could save.
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

/// This machine's name, for messages.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_say_how_a_run_ended() {
        assert_eq!(RunEnd::Finished.exit_code(), 0);
        assert_eq!(RunEnd::Preempted.exit_code(), 75);
        assert_eq!(RunEnd::Signalled(SIGTERM).exit_code(), 143);
        // A launcher with no worker running: the requeue code for a
        // preemption, and the signal's own code for SIGHUP.
        assert_eq!(RunEnd::stopped_early_by(SIGUSR1).exit_code(), 75);
        assert_eq!(RunEnd::stopped_early_by(SIGHUP).exit_code(), 129);
        assert_eq!(RunEnd::stopped_early_by(SIGINT).exit_code(), 130);
        assert!(!is_preemption(SIGUSR2));
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

    #[test]
    fn a_lost_peer_anywhere_in_the_chain_sets_its_exit_code() {
        let lost = comm::CommError::PeerLost {
            peer: 1,
            addr: "127.0.0.1:1".into(),
            op: "all_reduce",
            detail: "connection closed by peer".into(),
        };
        let e = anyhow::Error::new(lost).context("rank 0: epoch 1, step 3");
        assert_eq!(failure_exit_code(e.as_ref()), PEER_LOST_EXIT_CODE);
        let silent = comm::CommError::PeerTimeout {
            peer: 1,
            addr: "127.0.0.1:1".into(),
            op: "all_reduce",
            timeout: std::time::Duration::from_secs(30),
        };
        assert_eq!(failure_exit_code(&silent), PEER_LOST_EXIT_CODE);
        let store = crate::LaunchError::Store {
            doing: "node 1 joining the launchers at h:1".into(),
            cause: silent,
        };
        assert_eq!(failure_exit_code(&store), PEER_LOST_EXIT_CODE);
        let other = comm::CommError::InvalidArgument {
            op: "all_reduce",
            reason: "lengths differ".into(),
        };
        assert_eq!(failure_exit_code(&other), 1);
        let refused = anyhow::Error::new(Misconfigured("not this data".into()))
            .context("rank 0: --resume ckpt");
        assert_eq!(failure_exit_code(refused.as_ref()), MISCONFIGURED_EXIT_CODE);
        assert_eq!(refused.to_string(), "rank 0: --resume ckpt");
        assert_eq!(
            format!("{refused:#}"),
            "rank 0: --resume ckpt: not this data"
        );
        assert_eq!(failure_exit_code(anyhow::anyhow!("disk full").as_ref()), 1);
    }
}
