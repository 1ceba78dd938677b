//! The local launcher (torchrun's role on one machine): starts N workers of
//! this same binary with torchrun-style variables, prefixes their output
//! with the rank, and when one fails, stops the others and fails too; with
//! `--max-restarts N` it restarts them all instead, up to N times, each time
//! with `--resume auto` so that they continue from the newest checkpoint
//! (while there is none yet, as the first attempt started).
//!
//! Signals to the launcher (SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2) go on
//! to every worker, which get `--grace` seconds to stop (saving a checkpoint
//! on SIGTERM/SIGUSR1) before they are killed; a signal never restarts
//! them. The workers run in a process group of their own (a terminal's
//! Ctrl-C reaches the launcher alone, which passes it on once) and die with
//! the launcher, even when it is SIGKILLed.

mod flags;
mod group;
mod heartbeat;
mod node;
mod supervise;
mod workers;

use std::ffi::OsString;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow};
use comm::{AUTH_TOKEN_VAR, AuthToken, launch_var};
use group::NodeGroup;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;

use crate::checkpoint::CheckpointDir;
use crate::checkpoint::resume::{self, ResumeFrom};
use crate::cli::Cli;
use crate::stop::{PREEMPTED_EXIT_CODE, RunEnd, describe, die_with_parent};
pub use flags::{NodeFlags, RdzvBackend};
pub use node::NodePlan;
use supervise::supervise;
use workers::{Worker, stop};

/// The signals the launcher passes on to its workers.
const FORWARDED: [i32; 5] = [SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2];

/// How often the launcher checks on its workers.
const POLL: Duration = Duration::from_millis(50);

/// A failed attempt: the first failure alone, and the whole story.
struct Failure {
    first: String,
    message: String,
    /// False when no restart can help: another node's launcher is gone.
    restartable: bool,
}

/// How one attempt ended.
enum Outcome {
    /// Every worker exited with 0, or some with [`PREEMPTED_EXIT_CODE`].
    Ended(RunEnd),
    Failed(Failure),
}

/// How long workers get: to notice a failed peer, and to stop on a signal.
#[derive(Clone, Copy)]
struct Graces {
    failure: Duration,
    signal: Duration,
}

/// Runs this machine's share of the job (`plan`) with this process's flags
/// and waits for all of them, restarting them up to `--max-restarts` times.
///
/// After the first failure the others get `--timeout` to notice (they
/// report which peer they lost) and are then killed.
pub fn launch(cli: &Cli, plan: &NodePlan) -> anyhow::Result<RunEnd> {
    let mut signals =
        Signals::new(FORWARDED).context("installing the launcher's signal handlers")?;
    let graces = Graces {
        failure: Duration::from_secs_f64(cli.timeout),
        signal: Duration::from_secs_f64(cli.grace),
    };
    let exe = std::env::current_exe().context("finding this executable to start workers")?;
    let args = worker_args(std::env::args_os().skip(1));
    let dir = cli
        .checkpoint_dir
        .as_ref()
        .map(|d| CheckpointDir::new(d, cli.keep as usize));
    if let Some(dir) = dir.as_ref().filter(|_| cli.max_restarts > 0) {
        resume::preflight(cli.resume.as_ref(), dir)?;
    }
    let mut group = match &plan.master {
        Some(master) if plan.nnodes > 1 => {
            let auth = AuthToken::resolve(cli.auth_token_file.as_deref())
                .context("reading the job's auth token")?;
            let rdzv_id = cli.nodes.rdzv_id.as_deref().unwrap_or_default();
            let heartbeat = cli.nodes.heartbeat();
            // Node 0 waits for a late node's verdict; a third node's ranks
            // reporting their timeouts first would be taken at their word.
            if heartbeat >= graces.failure && plan.nnodes > 2 {
                tell!(
                    "launcher: --heartbeat-timeout {heartbeat:?} is not below --timeout {:?}: the ranks waiting on a stopped node may time out, and be blamed (and restarted), before it is found silent",
                    graces.failure
                );
            }
            Some(unless_signalled(&mut signals, || {
                NodeGroup::join(
                    plan.node_rank,
                    plan.nnodes,
                    master,
                    rdzv_id,
                    (graces.failure, heartbeat),
                    auth,
                )
            })?)
        }
        _ => None,
    };
    let node_rank = match &group {
        Some(g) => g.node_rank,
        None => plan.node_rank.context("one machine is node 0")?,
    };
    // Node 0's store outlives the other launchers' last look at it.
    let finish = |group: Option<&mut NodeGroup>, attempt| {
        if let Some(g) = group {
            g.finish(attempt, graces.failure + Duration::from_secs(10));
        }
    };
    let mut restarts = 0;
    loop {
        let args = if restarts == 0 {
            args.clone()
        } else {
            restart_args(&args, dir.as_ref())
        };
        let node = (node_rank, group.as_mut(), restarts);
        let failure = match run_workers(&exe, &args, plan, graces, &mut signals, node)? {
            Outcome::Ended(end) => {
                finish(group.as_mut(), restarts);
                return Ok(ended(end, dir.is_some()));
            }
            Outcome::Failed(failure) => failure,
        };
        if restarts == cli.max_restarts || !failure.restartable {
            finish(group.as_mut(), restarts);
            let spent = match restarts {
                _ if restarts < cli.max_restarts => {
                    " (not restarted: a restart would meet the same cause)".to_string()
                }
                0 => String::new(),
                _ => format!(" (after {restarts} restart(s))"),
            };
            return Err(anyhow!("{}{spent}", failure.message));
        }
        restarts += 1;
        let from = restart_point(dir.as_ref(), cli.resume.as_ref());
        tell!(
            "launcher: {}; restart {restarts} of {} from {from}",
            failure.first,
            cli.max_restarts
        );
    }
}

/// Says how the workers ended when that was not plain success.
fn ended(end: RunEnd, saves: bool) -> RunEnd {
    match end {
        RunEnd::Finished => {}
        RunEnd::Preempted => tell!(
            "launcher: the workers stopped on a preemption request (exit code {PREEMPTED_EXIT_CODE}); {}",
            if saves {
                "continue with --resume auto"
            } else {
                "nothing was saved (no --checkpoint-dir)"
            }
        ),
        RunEnd::Signalled(signal) => tell!(
            "launcher: stopped the workers on {}; exiting with {}",
            describe(signal),
            end.exit_code()
        ),
    }
    end
}

/// Runs `wait`, a wait on the other nodes while no worker of this node
/// runs, watching the launcher's signals meanwhile: one ends the launcher
/// at once, nothing being lost yet (75 for SIGTERM/SIGUSR1, the code on
/// which batch scripts requeue; 128 + signal otherwise), where the wait
/// itself would hold it for up to --timeout.
fn unless_signalled<T: Send>(signals: &mut Signals, wait: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|scope| {
        let waiting = scope.spawn(wait);
        loop {
            if waiting.is_finished() {
                return waiting
                    .join()
                    .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            }
            if let Some(signal) = signals.pending().next() {
                let code = RunEnd::stopped_early_by(signal).exit_code();
                tell!(
                    "launcher: {} while waiting for the other nodes (no workers running): exiting with {code}",
                    describe(signal)
                );
                std::process::exit(code);
            }
            std::thread::sleep(POLL);
        }
    })
}

/// Where restarted workers will continue, for the log: the newest
/// checkpoint by name (the workers validate it, and pass over one that
/// does not load), or, with none yet, where the first attempt started.
fn restart_point(dir: Option<&CheckpointDir>, first: Option<&ResumeFrom>) -> String {
    match dir.map(|d| d.list()) {
        Some(Ok(mut list)) => match (list.pop(), first) {
            (Some((_, path)), _) => {
                format!("the newest valid checkpoint ({} or older)", path.display())
            }
            (None, Some(ResumeFrom::Path(path))) => {
                format!(
                    "{} again (no checkpoint in --checkpoint-dir yet)",
                    path.display()
                )
            }
            (None, _) => "the start (no checkpoint yet)".to_string(),
        },
        Some(Err(e)) => format!("the newest valid checkpoint (listing failed: {e:#})"),
        None => "the start".to_string(),
    }
}

/// The launcher's flags less those for the launcher alone: the workers
/// restart nothing and learn their place from the environment.
fn worker_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let args = args.into_iter().filter(|a| a != flags::STANDALONE);
    let args = without(args, "--max-restarts");
    flags::LAUNCHER_ONLY.into_iter().fold(args, without)
}

/// `args` without `flag` and its value (`--flag V` or `--flag=V`).
fn without(args: impl IntoIterator<Item = OsString>, flag: &str) -> Vec<OsString> {
    let mut args = args.into_iter();
    let mut kept = Vec::new();
    while let Some(arg) = args.next() {
        if arg == flag {
            args.next();
        } else if !arg
            .to_str()
            .and_then(|a| a.strip_prefix(flag))
            .is_some_and(|rest| rest.starts_with('='))
        {
            kept.push(arg);
        }
    }
    kept
}

/// The flags of a restart: continue from the newest checkpoint in `dir`
/// (`--resume auto`); while it holds none, the first attempt's flags, so
/// that a `--resume PATH` from elsewhere is resumed, or refused, again
/// instead of becoming a fresh start (`--resume auto` over no checkpoint).
fn restart_args(args: &[OsString], dir: Option<&CheckpointDir>) -> Vec<OsString> {
    match dir.map(CheckpointDir::list) {
        Some(Ok(list)) if list.is_empty() => args.to_vec(),
        _ => resume_auto(args),
    }
}

/// The flags of a restart from the newest checkpoint: whatever `--resume`
/// said, `--resume auto` (`--init-from` still applies if there is none).
fn resume_auto(args: &[OsString]) -> Vec<OsString> {
    let mut args = without(args.iter().cloned(), "--resume");
    args.extend(["--resume", "auto"].map(OsString::from));
    args
}

/// The job secret this launcher makes for its workers: a fresh one per
/// attempt when it starts the whole job and the user gave none. Launchers
/// on several machines would each make another, so there the user's
/// (`TRAINER_AUTH_TOKEN`, `--auth-token-file`, passed on as they are) is the
/// job's, or none (the workers warn).
fn fresh_token(args: &[OsString], plan: &NodePlan) -> anyhow::Result<Option<AuthToken>> {
    let given = std::env::var_os(AUTH_TOKEN_VAR).is_some()
        || args.iter().any(|a| {
            a.to_str()
                .is_some_and(|a| a.starts_with("--auth-token-file"))
        });
    if given || plan.nnodes > 1 {
        return Ok(None);
    }
    Ok(Some(
        AuthToken::generate().context("generating the job's auth token")?,
    ))
}

/// One attempt: starts the workers and supervises them.
fn run_workers(
    exe: &Path,
    args: &[OsString],
    plan: &NodePlan,
    graces: Graces,
    signals: &mut Signals,
    (node_rank, mut group, attempt): (usize, Option<&mut NodeGroup>, u32),
) -> anyhow::Result<Outcome> {
    let master = match (group.as_mut(), &plan.master) {
        (Some(g), _) => unless_signalled(signals, || g.worker_master(attempt))?,
        (None, Some(master)) => master.clone(),
        (None, None) => ("127.0.0.1".to_string(), local_port()?),
    };
    let token = fresh_token(args, plan)?;
    let mut workers: Vec<Worker> = Vec::with_capacity(plan.nproc);
    for local_rank in 0..plan.nproc {
        let rank = node_rank * plan.nproc + local_rank;
        let mut command = Command::new(exe);
        die_with_parent(&mut command);
        // The first worker leads a new process group; the others join it.
        let group = workers.first().map_or(0, |w| w.child.id() as i32);
        let spawned = command
            .process_group(group)
            .args(args)
            .envs(node::worker_env(plan, node_rank, local_rank, &master))
            .envs(token.iter().map(|t| (AUTH_TOKEN_VAR, t.to_hex())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                stop(&mut workers);
                return Err(e)
                    .with_context(|| format!("starting worker rank {rank} ({})", exe.display()));
            }
        };
        tell!(
            "launcher: started rank {rank} (pid {}), master {}:{}",
            child.id(),
            master.0,
            master.1
        );
        workers.push(Worker::attach(rank, child));
    }
    Ok(supervise(
        &mut workers,
        graces,
        signals,
        group.map(|g| (g, attempt)),
    ))
}

/// The store's port on one machine: `MASTER_PORT`, else a free one.
fn local_port() -> anyhow::Result<u16> {
    match std::env::var(launch_var::MASTER_PORT) {
        Ok(p) => p
            .parse::<u16>()
            .map_err(|_| anyhow!("{}={p:?} is not a port number", launch_var::MASTER_PORT)),
        Err(_) => free_port(),
    }
}

/// A port nobody listens on right now, for rank 0's store.
fn free_port() -> anyhow::Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").context("finding a free port for the rendezvous")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn restarts_resume_auto_and_workers_never_see_max_restarts() {
        let given = os(&[
            "--world-size",
            "2",
            "--max-restarts",
            "3",
            "--resume=ckpt",
            "--epochs",
            "4",
            "--max-restarts=1",
        ]);
        let workers = worker_args(given);
        assert_eq!(
            workers,
            os(&["--world-size", "2", "--resume=ckpt", "--epochs", "4"])
        );
        assert_eq!(
            resume_auto(&workers),
            os(&["--world-size", "2", "--epochs", "4", "--resume", "auto"])
        );
        let spaced = os(&["--resume", "ckpt", "--init-from", "w.safetensors"]);
        assert_eq!(
            resume_auto(&spaced),
            os(&["--init-from", "w.safetensors", "--resume", "auto"])
        );
        let torchrun = os(&[
            "--nnodes=2",
            "--node_rank",
            "1",
            "--standalone",
            "--rdzv-endpoint=h:1",
            "--heartbeat-timeout",
            "2",
            "--epochs",
            "4",
        ]);
        assert_eq!(worker_args(torchrun), os(&["--epochs", "4"]));
        // A longer flag with the same prefix is not the flag.
        assert_eq!(
            without(os(&["--resume-x=1"]), "--resume"),
            os(&["--resume-x=1"])
        );
    }

    /// Until the job has saved a checkpoint, a restart starts as the first
    /// attempt did: a `--resume PATH` that was refused is refused again,
    /// not turned into a fresh start by `--resume auto` over nothing.
    #[test]
    fn a_restart_before_any_checkpoint_starts_as_the_first_attempt_did() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = CheckpointDir::new(tmp.path().join("ckpt"), 3);
        let first = os(&["--resume", "elsewhere/ckpt-e0001-s000004"]);
        assert_eq!(restart_args(&first, Some(&dir)), first);
        let from = ResumeFrom::Path("elsewhere/ckpt-e0001-s000004".into());
        assert_eq!(
            restart_point(Some(&dir), Some(&from)),
            "elsewhere/ckpt-e0001-s000004 again (no checkpoint in --checkpoint-dir yet)"
        );
        std::fs::create_dir_all(dir.path().join("ckpt-e0001-s000002")).unwrap();
        assert_eq!(restart_args(&first, Some(&dir)), os(&["--resume", "auto"]));
    }
}
