//! The local launcher (torchrun's role on one machine): starts N workers of
//! this same binary with torchrun-style variables, prefixes their output
//! with the rank, and when one fails, stops the others and fails too; with
//! `--max-restarts N` it restarts them all instead, up to N times, each time
//! with `--resume auto` so that they continue from the newest checkpoint.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use comm::{AUTH_TOKEN_VAR, AuthToken, launch_var};
use core_tensor::FlatLayout;

use crate::checkpoint::{CheckpointDir, resume};
use crate::cli::Cli;
use crate::model::cnn_layout;

/// How often the launcher checks on its workers.
const POLL: Duration = Duration::from_millis(50);

struct Worker {
    rank: usize,
    child: Child,
    /// The last `error:` line the worker printed, to quote if it fails.
    last_error: Arc<Mutex<Option<String>>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

/// A failed attempt: the first failure alone, and the whole story.
struct Failure {
    first: String,
    message: String,
}

/// Runs `world_size` workers on this machine with this process's flags and
/// waits for all of them, restarting them up to `--max-restarts` times.
///
/// After the first failure the others get `--timeout` to notice (they
/// report which peer they lost) and are then killed.
pub fn launch(cli: &Cli, world_size: usize) -> anyhow::Result<()> {
    let grace = Duration::from_secs_f64(cli.timeout);
    let exe = std::env::current_exe().context("finding this executable to start workers")?;
    let args = without(std::env::args_os().skip(1), "--max-restarts");
    let layout = cnn_layout();
    let dir = cli
        .checkpoint_dir
        .as_ref()
        .map(|d| CheckpointDir::new(d, cli.keep as usize));
    if let Some(dir) = dir.as_ref().filter(|_| cli.max_restarts > 0) {
        resume::preflight(cli.resume.as_ref(), dir, layout)?;
    }
    let mut restarts = 0;
    loop {
        let args = if restarts == 0 {
            args.clone()
        } else {
            resume_auto(&args)
        };
        let Some(failure) = run_workers(&exe, &args, world_size, grace)? else {
            return Ok(());
        };
        if restarts == cli.max_restarts {
            let spent = if restarts > 0 {
                format!(" (after {restarts} restart(s))")
            } else {
                String::new()
            };
            return Err(anyhow!("{}{spent}", failure.message));
        }
        restarts += 1;
        let from = restart_point(dir.as_ref(), layout);
        eprintln!(
            "launcher: {}; restart {restarts} of {} from {from}",
            failure.first, cli.max_restarts
        );
    }
}

/// Where restarted workers will continue, for the log.
fn restart_point(dir: Option<&CheckpointDir>, layout: &FlatLayout) -> String {
    match dir.map(|d| d.newest_valid(layout)) {
        Some(Ok(newest)) => match newest.found {
            Some((path, _)) => format!("checkpoint {}", path.display()),
            None => "the start (no checkpoint yet)".to_string(),
        },
        Some(Err(e)) => format!("the newest valid checkpoint (listing failed: {e:#})"),
        None => "the start".to_string(),
    }
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

/// The flags of a restart: whatever `--resume` said, continue from the
/// newest checkpoint (`--init-from` still applies if there is none yet).
fn resume_auto(args: &[OsString]) -> Vec<OsString> {
    let mut args = without(args.iter().cloned(), "--resume");
    args.extend(["--resume", "auto"].map(OsString::from));
    args
}

/// One attempt: starts the workers and supervises them; `Some` if one failed.
fn run_workers(
    exe: &Path,
    args: &[OsString],
    world_size: usize,
    grace: Duration,
) -> anyhow::Result<Option<Failure>> {
    let port = match std::env::var(launch_var::MASTER_PORT) {
        Ok(p) => p
            .parse::<u16>()
            .map_err(|_| anyhow!("{}={p:?} is not a port number", launch_var::MASTER_PORT))?,
        Err(_) => free_port()?,
    };
    // A fresh job secret per attempt; only this launcher's workers hold it.
    let token = AuthToken::generate().context("generating the job's auth token")?;
    let mut workers = Vec::with_capacity(world_size);
    for rank in 0..world_size {
        let spawned = Command::new(exe)
            .args(args)
            .env(launch_var::RANK, rank.to_string())
            .env(launch_var::WORLD_SIZE, world_size.to_string())
            .env(launch_var::LOCAL_RANK, rank.to_string())
            .env(launch_var::LOCAL_WORLD_SIZE, world_size.to_string())
            .env(launch_var::MASTER_ADDR, "127.0.0.1")
            .env(launch_var::MASTER_PORT, port.to_string())
            .env(AUTH_TOKEN_VAR, token.to_hex())
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
        eprintln!(
            "launcher: started rank {rank} (pid {}), master 127.0.0.1:{port}",
            child.id()
        );
        workers.push(Worker::attach(rank, child));
    }
    Ok(supervise(&mut workers, grace))
}

/// A port nobody listens on right now, for rank 0's store.
fn free_port() -> anyhow::Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").context("finding a free port for the rendezvous")?;
    Ok(listener.local_addr()?.port())
}

impl Worker {
    fn attach(rank: usize, mut child: Child) -> Self {
        let last_error = Arc::new(Mutex::new(None));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(relay(rank, out, false, last_error.clone()));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(relay(rank, err, true, last_error.clone()));
        }
        Self {
            rank,
            child,
            last_error,
            readers,
            status: None,
        }
    }

    fn describe_failure(&self) -> String {
        let status = self
            .status
            .map_or("killed by the launcher".to_string(), |s| s.to_string());
        let said = self.last_error.lock().ok().and_then(|e| e.clone());
        match said {
            Some(line) => format!("rank {} failed ({status}): {line}", self.rank),
            None => format!(
                "rank {} failed ({status}) without an error message",
                self.rank
            ),
        }
    }
}

/// Copies a worker's output line by line, prefixed with its rank.
fn relay(
    rank: usize,
    stream: impl Read + Send + 'static,
    is_stderr: bool,
    last_error: Arc<Mutex<Option<String>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if is_stderr {
                if let Some(msg) = line.strip_prefix("error: ")
                    && let Ok(mut slot) = last_error.lock()
                {
                    *slot = Some(msg.to_string());
                }
                eprintln!("[rank {rank}] {line}");
            } else {
                println!("[rank {rank}] {line}");
            }
        }
    })
}

/// Waits for all workers; on the first failure waits `grace` for the rest,
/// kills what is left, and describes the failures.
fn supervise(workers: &mut [Worker], grace: Duration) -> Option<Failure> {
    let mut first_failure: Option<usize> = None;
    let mut deadline: Option<Instant> = None;
    loop {
        let mut failed_now = Vec::new();
        for (i, w) in workers.iter_mut().enumerate() {
            if w.status.is_none()
                && let Ok(Some(status)) = w.child.try_wait()
            {
                w.status = Some(status);
                if !status.success() {
                    failed_now.push((i, status));
                }
            }
        }
        if first_failure.is_none()
            && let Some((i, status)) = root_cause(&failed_now)
        {
            first_failure = Some(i);
            deadline = Some(Instant::now() + grace);
            eprintln!(
                "launcher: rank {} exited with {status}; stopping the other ranks",
                workers[i].rank
            );
        }
        let running = workers.iter().filter(|w| w.status.is_none()).count();
        if running == 0 || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        std::thread::sleep(POLL);
    }
    stop(workers);
    let i = first_failure?;
    let others: Vec<String> = workers
        .iter()
        .enumerate()
        .filter(|(j, w)| *j != i && !w.status.is_some_and(|s| s.success()))
        .map(|(_, w)| w.describe_failure())
        .collect();
    let first = workers[i].describe_failure();
    let mut message = first.clone();
    if !others.is_empty() {
        message.push_str(&format!("; then {}", others.join("; ")));
    }
    Some(Failure { first, message })
}

/// Of the ranks found failed in one look, the one to blame: a rank killed by
/// a signal (the OOM killer, `kill -9`) before one that exited with an
/// error, which is usually its peers' reaction to losing it.
fn root_cause(failed: &[(usize, ExitStatus)]) -> Option<(usize, ExitStatus)> {
    failed
        .iter()
        .find(|(_, status)| status.signal().is_some())
        .or(failed.first())
        .copied()
}

/// Kills workers still running and drains their output.
fn stop(workers: &mut [Worker]) {
    for w in workers.iter_mut() {
        if w.status.is_none() {
            let _ = w.child.kill();
            w.status = w.child.wait().ok();
        }
        for reader in w.readers.drain(..) {
            let _ = reader.join();
        }
    }
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
        let workers = without(given, "--max-restarts");
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
        // A longer flag with the same prefix is not the flag.
        assert_eq!(
            without(os(&["--resume-x=1"]), "--resume"),
            os(&["--resume-x=1"])
        );
    }

    #[test]
    fn a_rank_killed_by_a_signal_is_blamed_before_its_peers_reaction() {
        // Raw wait statuses: exit code 1 is 1 << 8, SIGKILL is 9.
        let exited = ExitStatus::from_raw(1 << 8);
        let killed = ExitStatus::from_raw(9);
        assert_eq!(root_cause(&[]), None);
        assert_eq!(root_cause(&[(0, exited)]), Some((0, exited)));
        assert_eq!(root_cause(&[(0, exited), (1, killed)]), Some((1, killed)));
        assert_eq!(root_cause(&[(0, exited), (2, exited)]), Some((0, exited)));
    }
}
