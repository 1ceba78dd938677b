//! What a launcher is asked to run ([`WorkerSpec`], torchrun's), and what
//! it asks of the workers' program when it restarts them ([`Restarts`]).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use comm::AuthChoice;

use crate::args;
use crate::error::{Doing, LaunchError, Refusal};
use crate::flags::LaunchFlags;

/// What a launcher runs on its machine and how it treats the workers
/// (torchrun's `WorkerSpec`).
#[derive(Clone, Debug)]
pub struct WorkerSpec {
    /// The program every worker runs.
    pub exe: PathBuf,
    /// The workers' arguments (the first attempt's): the launcher's own
    /// command line less the launcher's flags.
    pub args: Vec<OsString>,
    /// How long the other workers get, after one failed, to report which
    /// peer they lost (the job's collective timeout).
    pub failure_grace: Duration,
    /// How long the launchers of several machines may take to meet (the
    /// job's join timeout, `--rdzv-timeout`).
    pub rdzv_timeout: Duration,
    /// How long the workers get to stop after a signal (`--grace`).
    pub signal_grace: Duration,
    pub max_restarts: u32,
    /// Where the job's token comes from, for the launchers' own store and
    /// the workers': the user's file, `TRAINER_AUTH_TOKEN` (else a fresh
    /// token per attempt on one machine), or none (`--no-auth`), even
    /// where other machines can reach the launchers' store.
    pub auth: AuthChoice,
    /// The job's name at the rendezvous (`--rdzv-id`).
    pub rdzv_id: String,
    /// How long a launcher may go silent (`--heartbeat-timeout`).
    pub heartbeat: Duration,
    /// Where the workers write their flight records (`comm::flight`), for
    /// the verdict on a failed attempt; none: no verdict.
    pub flight_recorder: Option<PathBuf>,
    /// What a worker's failure does to the others.
    pub on_failure: OnFailure,
}

/// What a worker's failure does to the attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// It ends the attempt: every worker stops, and all restart (up to
    /// `max_restarts` times), torchrun's way.
    #[default]
    RestartAll,
    /// The others go on without it (the program re-forms its job over
    /// them) and a replacement starts in its place, up to `max_restarts`
    /// replacements in all; after those, the others go on alone. A worker
    /// that says the job itself is lost (`PEER_LOST_EXIT_CODE`) or
    /// misconfigured still ends the attempt.
    Replace,
}

impl WorkerSpec {
    /// This process's own program and command line, as `flags` and the
    /// program's collective and join timeouts and its `auth` say.
    pub fn of_this_process(
        flags: &LaunchFlags,
        (timeout, rdzv_timeout): (Duration, Duration),
        auth: AuthChoice,
    ) -> Result<Self, LaunchError> {
        Ok(Self {
            exe: std::env::current_exe()
                .doing(|| "finding this executable to start workers".into())?,
            args: args::worker_args(std::env::args_os().skip(1)),
            failure_grace: timeout,
            rdzv_timeout,
            signal_grace: Duration::from_secs_f64(flags.grace),
            max_restarts: flags.max_restarts,
            auth,
            rdzv_id: flags.rdzv.rdzv_id.clone().unwrap_or_default(),
            heartbeat: flags.rdzv.heartbeat(),
            flight_recorder: None,
            on_failure: OnFailure::RestartAll,
        })
    }
}

/// What the launcher asks of the workers' program about restarts.
pub trait Restarts {
    /// The workers' arguments for a restart, given the first attempt's.
    fn args(&self, first: &[OsString]) -> Vec<OsString>;

    /// Where restarted workers will continue, for the log.
    fn continues_from(&self) -> String;

    /// What to do after the workers stopped on a preemption request (what
    /// they saved, and how to go on), for the log.
    fn after_preemption(&self) -> String;

    /// What node 0's launcher, the one process of the job that outlives
    /// every restart, takes for the job's life before it starts the first
    /// workers (the trainer: its checkpoint directory), and the variables
    /// that tell its workers so; an error refuses the job. By default,
    /// nothing.
    fn hold(&self) -> Result<Vec<(OsString, OsString)>, Refusal> {
        Ok(Vec::new())
    }
}
