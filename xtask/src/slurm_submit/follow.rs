//! `--wait`: follows a submitted job until it ends, streaming its log.
//!
//! Polls `scontrol show job` every half second rather than using
//! `sbatch --wait`, which polls with a growing back-off of up to 32 s, and
//! which could neither cancel a job stuck in the queue nor stream its log.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

const POLL: Duration = Duration::from_millis(500);
/// Consecutive failed `scontrol` calls tolerated (a busy controller times
/// out now and then) before giving up.
const MAX_QUERY_FAILURES: u32 = 20;

/// States after which a job never runs again.
const TERMINAL: &[&str] = &[
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
];

/// What `scontrol show job -o` says about a job.
#[derive(Debug, PartialEq)]
pub struct JobInfo {
    pub state: String,
    pub reason: String,
    pub exit_code: String,
    pub nodes: String,
}

impl JobInfo {
    /// Parses the one-line form, whose fields are `Key=Value` separated by spaces.
    pub fn parse(line: &str) -> Option<JobInfo> {
        let field = |key: &str| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
                .map(str::to_owned)
        };
        Some(JobInfo {
            state: field("JobState")?,
            reason: field("Reason").unwrap_or_default(),
            exit_code: field("ExitCode").unwrap_or_default(),
            nodes: field("NodeList").unwrap_or_default(),
        })
    }
}

/// Lets a job submitted with `--hold` run, once any log left at `log` by an
/// earlier job with the same id is gone. Job ids restart at 1 on a fresh
/// cluster (or wrap around), and the stale file would otherwise be streamed
/// as this job's output.
pub fn release(job_id: &str, log: &Path) -> Result<()> {
    match std::fs::remove_file(log) {
        Ok(()) => eprintln!(
            "slurm-submit: removed {}, left by an earlier job with the same id",
            log.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            cancel(job_id)?;
            return Err(e).with_context(|| {
                format!(
                    "removing the stale log {} (job {job_id} cancelled)",
                    log.display()
                )
            });
        }
    }
    let out = Command::new("scontrol")
        .args(["release", job_id])
        .output()
        .context("running `scontrol release`")?;
    if !out.status.success() {
        cancel(job_id)?;
        bail!(
            "`scontrol release {job_id}` failed: {} (job cancelled)",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Polls the job until it ends, streaming its log to stdout; succeeds only if
/// the job COMPLETED. A job queued longer than `pending_timeout` is cancelled.
pub fn follow(job_id: &str, log: &Path, pending_timeout: Duration) -> Result<()> {
    let mut tail = LogTail::new(log.to_owned());
    let mut failures = 0;
    let mut last_state = String::new();
    let mut pending_since: Option<Instant> = None;
    loop {
        let info = match query(job_id) {
            Ok(info) => {
                failures = 0;
                info
            }
            Err(err) if failures < MAX_QUERY_FAILURES => {
                failures += 1;
                eprintln!("slurm-submit: {err:#}; retrying");
                sleep(POLL);
                continue;
            }
            Err(err) => {
                return Err(err.context(format!(
                    "lost track of job {job_id}; it may still be running (squeue -j {job_id}), log: {}",
                    log.display()
                )));
            }
        };
        tail.pump()?;
        if info.state != last_state {
            eprintln!(
                "slurm-submit: job {job_id} {} ({})",
                info.state,
                describe(&info)
            );
            last_state.clone_from(&info.state);
        }
        if info.state == "PENDING" {
            let since = *pending_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= pending_timeout {
                cancel(job_id)?;
                bail!(
                    "job {job_id} could not be scheduled: still PENDING (reason: {}) after {} s, \
                     so it was cancelled; check the requested nodes/GPUs/partition against \
                     `sinfo`, or raise --pending-timeout on a busy cluster",
                    info.reason,
                    pending_timeout.as_secs()
                );
            }
        } else {
            pending_since = None;
        }
        if TERMINAL.contains(&info.state.as_str()) {
            tail.pump()?;
            if info.state == "COMPLETED" {
                println!("job {job_id} COMPLETED (exit code {})", info.exit_code);
                return Ok(());
            }
            bail!(
                "job {job_id} ended {} with exit code {} (reason: {}); log: {}",
                info.state,
                info.exit_code,
                info.reason,
                log.display()
            );
        }
        sleep(POLL);
    }
}

fn describe(info: &JobInfo) -> String {
    if info.state == "PENDING" {
        format!("reason: {}", info.reason)
    } else {
        format!("nodes: {}", info.nodes)
    }
}

fn query(job_id: &str) -> Result<JobInfo> {
    let out = Command::new("scontrol")
        .args(["show", "job", "-o", job_id])
        .output()
        .context("running `scontrol` (it comes with sbatch in the SLURM client tools)")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "`scontrol show job {job_id}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    JobInfo::parse(&stdout)
        .with_context(|| format!("no JobState in `scontrol show job {job_id}` output: {stdout}"))
}

fn cancel(job_id: &str) -> Result<()> {
    let status = Command::new("scancel")
        .arg(job_id)
        .status()
        .context("running `scancel`")?;
    if !status.success() {
        bail!("`scancel {job_id}` failed ({status}); cancel the job by hand");
    }
    Ok(())
}

/// Copies what a growing file gains to stdout. The file appears only once the
/// job starts, so a missing file is not an error.
struct LogTail {
    path: PathBuf,
    file: Option<File>,
}

impl LogTail {
    fn new(path: PathBuf) -> LogTail {
        LogTail { path, file: None }
    }

    fn pump(&mut self) -> Result<()> {
        if self.file.is_none() {
            match File::open(&self.path) {
                Ok(file) => self.file = Some(file),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
                Err(e) => {
                    return Err(e).with_context(|| format!("opening {}", self.path.display()));
                }
            }
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(());
        };
        let mut fresh = Vec::new();
        file.read_to_end(&mut fresh)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let mut stdout = std::io::stdout().lock();
        stdout
            .write_all(&fresh)
            .context("writing the job log to stdout")?;
        stdout.flush().context("writing the job log to stdout")?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_one_line_scontrol_format() {
        let line = "JobId=7 JobName=fmnist-ddp UserId=me(1000) JobState=FAILED Reason=NonZeroExitCode \
                    Dependency=(null) Requeue=1 ExitCode=1:0 RunTime=00:00:03 NodeList=node[1-2] \
                    BatchHost=node1 Command=/home/me/my jobs/run.sbatch WorkDir=/home/me";
        let info = JobInfo::parse(line).unwrap();
        assert_eq!(
            info,
            JobInfo {
                state: "FAILED".into(),
                reason: "NonZeroExitCode".into(),
                exit_code: "1:0".into(),
                nodes: "node[1-2]".into(),
            }
        );
    }

    #[test]
    fn does_not_mistake_longer_keys_for_the_field() {
        let info =
            JobInfo::parse("JobStateX=NO JobState=RUNNING ReqNodeList=(null) NodeList=n1").unwrap();
        assert_eq!(info.state, "RUNNING");
        assert_eq!(info.nodes, "n1");
        assert_eq!(
            JobInfo::parse("slurm_load_jobs error: Invalid job id specified"),
            None
        );
    }
}
