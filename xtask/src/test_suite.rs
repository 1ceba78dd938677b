//! `cargo xtask test`: the workspace's tests, `--jobs` test binaries at a
//! time.
//!
//! `cargo test --workspace` runs one test binary after another. Most of this
//! suite's binaries spend their time waiting rather than computing: on a
//! local SLURM cluster, on the timeouts of the trainers they start, on
//! mmdebstrap, on NVRTC in a child process. Run one at a time they kept one
//! of CI's two cores busy on average (1,282 s of user time in 1,337 s), so
//! this runs several side by side, the longest first, and prints each
//! binary's output whole once it ends (never interleaved), then the
//! totals. Each binary gets what `cargo test` gives it: its package folder
//! as working directory and cargo's `CARGO*` variables (and, unlike under
//! `cargo test`, a `TMPDIR` of its own, removed after it); the tests that must
//! not overlap already take turns across processes (the SLURM clusters, see
//! xtask/tests/common) or build into a folder by one rename (cuda-emu).
//!
//! A binary that runs past `--timeout` is killed with its process group and
//! counted as failed, so a hang ends the run instead of blocking CI; on
//! SIGINT, SIGTERM or SIGHUP the running binaries are stopped the same way.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Seek, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::interrupt::StopFlag;
use crate::trainer_build::{cargo, executable, workspace_root};

#[derive(clap::Args)]
pub struct Args {
    /// How many test binaries run at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Seconds a test binary may run before it is killed and counted as failed.
    #[arg(long, default_value_t = 1800)]
    timeout: u64,
    /// Passed to every test binary, as after `cargo test --workspace --`
    /// (a test name filter, `--nocapture`, `--include-ignored`).
    #[arg(last = true)]
    test_args: Vec<String>,
}

/// The binaries that ran longest when measured (`cargo xtask test`'s own
/// table, 2-core VM), started first so that none of them starts last and
/// runs alone; the others follow in cargo's order. Only the order depends on
/// this list: a binary missing from it still runs.
const LONGEST_FIRST: &[&str] = &[
    "cuda_emulated",
    "cuda_parity",
    "comm_hooks",
    "emulated_hooks",
    "nvrtc_compile",
    "live_recovery",
    "slurm_cluster",
    "container",
    "pipeline_equivalence",
    "slurm_requeue",
    "multinode",
];

/// One thing to run: a test binary, or the doc tests.
struct Job {
    /// What the report calls it: the package and the test target.
    label: String,
    /// The test target's name (`LONGEST_FIRST`'s).
    target: String,
    command: Command,
}

/// How a job ended.
struct Finished {
    label: String,
    outcome: Outcome,
    seconds: f64,
    output: String,
}

#[derive(Clone, Copy, PartialEq)]
enum Outcome {
    Passed,
    Failed(Option<i32>),
    TimedOut,
    Stopped,
}

pub fn run(args: Args) -> Result<()> {
    let root = workspace_root();
    let stop = StopFlag::install()?;
    let mut jobs = test_binaries(&root, &args.test_args)?;
    jobs.push(doc_tests(&root, &args.test_args));
    let cores = thread::available_parallelism().map_or(1, usize::from);
    let workers = args.jobs.unwrap_or(cores).clamp(1, jobs.len());
    eprintln!(
        "xtask test: {} test binaries and the doc tests, {workers} at a time",
        jobs.len() - 1
    );
    let started = Instant::now();
    let finished = run_all(jobs, workers, Duration::from_secs(args.timeout), &stop)?;
    report(&finished, started.elapsed())
}

/// Builds every test binary of the workspace, as `cargo test --workspace`
/// would, and returns how to run each.
fn test_binaries(root: &Path, test_args: &[String]) -> Result<Vec<Job>> {
    let cargo = cargo();
    let mut build = Command::new(&cargo);
    build
        .current_dir(root)
        .args(["test", "--workspace", "--no-run"])
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    let mut child = build
        .spawn()
        .context("running `cargo test --workspace --no-run`")?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let mut jobs = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading cargo's messages")?;
        let Some(built) = executable(&line).filter(|e| e.test) else {
            continue;
        };
        let package_dir = built.manifest.parent().unwrap_or(root);
        let mut command = Command::new(&built.path);
        command
            .current_dir(package_dir)
            .args(test_args)
            .env("CARGO", &cargo)
            .env("CARGO_MANIFEST_DIR", package_dir)
            .env("CARGO_MANIFEST_PATH", &built.manifest)
            .env("CARGO_PKG_NAME", &built.package)
            .env("CARGO_CRATE_NAME", built.target.replace('-', "_"))
            // Left by `cargo run` for xtask itself.
            .env_remove("CARGO_BIN_NAME")
            .env_remove("CARGO_PRIMARY_PACKAGE");
        jobs.push(Job {
            label: format!("{} ({} {})", built.package, built.kind, built.target),
            target: built.target,
            command,
        });
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!("`cargo test --workspace --no-run` failed ({status}); fix the build first");
    }
    if jobs.is_empty() {
        bail!("`cargo test --workspace --no-run` built no test binary");
    }
    jobs.sort_by_key(|job| rank(&job.target));
    Ok(jobs)
}

/// Where a binary stands in [`LONGEST_FIRST`] (the rest after it, in order:
/// the sort is stable).
fn rank(target: &str) -> usize {
    LONGEST_FIRST
        .iter()
        .position(|name| *name == target)
        .unwrap_or(LONGEST_FIRST.len())
}

fn doc_tests(root: &Path, test_args: &[String]) -> Job {
    let mut command = Command::new(cargo());
    command
        .current_dir(root)
        .args(["test", "--workspace", "--doc", "--"])
        .args(test_args);
    Job {
        label: "doc tests (cargo test --workspace --doc)".into(),
        target: "doc tests".into(),
        command,
    }
}

/// Runs the jobs, `workers` at a time, printing each as it ends.
fn run_all(
    jobs: Vec<Job>,
    workers: usize,
    timeout: Duration,
    stop: &StopFlag,
) -> Result<Vec<Finished>> {
    let total = jobs.len();
    let queue = Mutex::new(VecDeque::from(jobs));
    let (done, results) = mpsc::channel();
    thread::scope(|scope| {
        for _ in 0..workers {
            let done = done.clone();
            let queue = &queue;
            scope.spawn(move || {
                // After a stop signal no job starts.
                while stop.check().is_ok()
                    && let Some(job) = queue.lock().map_or(None, |mut q| q.pop_front())
                {
                    let finished = run_one(job, timeout, stop);
                    if done.send(finished).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done);
        let mut finished = Vec::with_capacity(total);
        for result in results {
            let result = result?;
            print_finished(&result, finished.len() + 1, total);
            finished.push(result);
        }
        Ok(finished)
    })
}

/// Runs one job to its end, its output (stdout and stderr, in the order
/// written) into a file it is read back from.
///
/// The job's `TMPDIR` is a folder of its own, removed when it passes: what
/// it leaves in the temporary folder (the synthetic data sets a test binary
/// keeps for its whole life, the flight recorders of trainers run without
/// a checkpoint folder, torchrun's `torchelastic_*`) came to 42 folders,
/// 121 MiB, a run in /tmp. A job that fails or times out keeps it, and
/// the report names it.
fn run_one(mut job: Job, timeout: Duration, stop: &StopFlag) -> Result<Finished> {
    let mut log = tempfile::tempfile().context("creating a file for a test's output")?;
    // A short name: Unix socket paths (OpenMPI's, in TMPDIR) are limited
    // to 107 bytes.
    let scratch = tempfile::Builder::new()
        .prefix("xtask-")
        .tempdir()
        .context("creating a test's temporary folder")?;
    let started = Instant::now();
    // Its own process group, so that a timeout or a signal stops the trainers
    // and daemons it started too.
    let child = job
        .command
        .env("TMPDIR", scratch.path())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log.try_clone()?)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {}", job.label))?;
    let outcome = wait(child, timeout, stop).with_context(|| format!("running {}", job.label))?;
    let seconds = started.elapsed().as_secs_f64();
    let mut output = Vec::new();
    log.rewind()?;
    log.read_to_end(&mut output)
        .with_context(|| format!("reading back the output of {}", job.label))?;
    let mut output = String::from_utf8_lossy(&output).into_owned();
    // What a failure left may say why; a stopped run wants nothing left.
    if matches!(outcome, Outcome::Failed(_) | Outcome::TimedOut) {
        let kept = scratch.keep();
        output.push_str(&format!("\n(its TMPDIR is kept: {})\n", kept.display()));
    }
    Ok(Finished {
        label: job.label,
        outcome,
        seconds,
        output,
    })
}

fn wait(mut child: Child, timeout: Duration, stop: &StopFlag) -> Result<Outcome> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(outcome_of(status));
        }
        let outcome = if stop.check().is_err() {
            Outcome::Stopped
        } else if started.elapsed() > timeout {
            Outcome::TimedOut
        } else {
            thread::sleep(Duration::from_millis(50));
            continue;
        };
        kill_group(&mut child);
        return Ok(outcome);
    }
}

fn outcome_of(status: ExitStatus) -> Outcome {
    match status.success() {
        true => Outcome::Passed,
        false => Outcome::Failed(status.code()),
    }
}

/// SIGTERM to the child's process group, SIGKILL after a grace period.
fn kill_group(child: &mut Child) {
    let group = format!("-{}", child.id());
    let signal = |name: &str| {
        let _ = Command::new("kill")
            .args([name, "--", &group])
            .stderr(Stdio::null())
            .status();
    };
    signal("-TERM");
    let grace = Instant::now();
    while grace.elapsed() < Duration::from_secs(10) {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    signal("-KILL");
    let _ = child.wait();
}

fn print_finished(job: &Finished, index: usize, total: usize) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "\n== [{index}/{total}] {}: {} in {:.1} s",
        job.label,
        describe(job.outcome),
        job.seconds
    );
    let _ = out.write_all(job.output.as_bytes());
    let _ = out.flush();
}

fn describe(outcome: Outcome) -> String {
    match outcome {
        Outcome::Passed => "ok".into(),
        Outcome::Failed(Some(code)) => format!("FAILED (exit status {code})"),
        Outcome::Failed(None) => "FAILED (killed by a signal)".into(),
        Outcome::TimedOut => "FAILED (timed out, killed)".into(),
        Outcome::Stopped => "stopped by a signal".into(),
    }
}

/// The totals of every binary's `test result:` lines, the longest binaries,
/// and an error naming the failed ones.
fn report(finished: &[Finished], elapsed: Duration) -> Result<()> {
    let (mut passed, mut failed) = (0u64, 0u64);
    for line in finished.iter().flat_map(|job| job.output.lines()) {
        if let Some(result) = line.strip_prefix("test result: ") {
            passed += count_before(result, "passed");
            failed += count_before(result, "failed");
        }
    }
    let mut longest: Vec<&Finished> = finished.iter().collect();
    longest.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
    println!("\n== the longest test binaries");
    for job in longest.iter().take(12) {
        println!("{:8.1} s  {}", job.seconds, job.label);
    }
    println!(
        "\ntests: {passed} passed, {failed} failed; {} binaries in {:.0} s",
        finished.len(),
        elapsed.as_secs_f64()
    );
    let bad: Vec<String> = finished
        .iter()
        .filter(|job| job.outcome != Outcome::Passed)
        .map(|job| format!("{} ({})", job.label, describe(job.outcome)))
        .collect();
    if !bad.is_empty() {
        bail!(
            "{} of {} test binaries did not pass: {}",
            bad.len(),
            finished.len(),
            bad.join("; ")
        );
    }
    Ok(())
}

/// `12` from `ok. 12 passed; 0 failed; …` for `word` = `passed`.
fn count_before(result: &str, word: &str) -> u64 {
    let words: Vec<&str> = result.split_whitespace().collect();
    words
        .windows(2)
        .find(|pair| pair[1].trim_end_matches(';') == word)
        .and_then(|pair| pair[0].parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_totals_are_read_from_libtests_result_lines() {
        let line =
            "ok. 12 passed; 3 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.10s";
        assert_eq!(count_before(line, "passed"), 12);
        assert_eq!(count_before(line, "failed"), 3);
        assert_eq!(count_before("FAILED. 0 passed; 7 failed;", "failed"), 7);
    }

    #[test]
    fn the_longest_binaries_go_first_and_the_rest_keep_their_order() {
        let mut targets = vec!["store", "cuda_emulated", "comm", "cuda_parity"];
        targets.sort_by_key(|target| rank(target));
        assert_eq!(targets, ["cuda_emulated", "cuda_parity", "store", "comm"]);
    }

    #[test]
    fn a_jobs_own_temporary_folder_goes_when_it_passes_and_stays_when_it_fails() {
        let stop = StopFlag::install().unwrap();
        for (status, kept) in [(0, false), (1, true)] {
            let mut command = Command::new("sh");
            let script = format!("touch \"$TMPDIR/left\" && echo \"$TMPDIR\" && exit {status}");
            command.args(["-c", &script]);
            let job = Job {
                label: "sh".into(),
                target: "sh".into(),
                command,
            };
            let done = run_one(job, Duration::from_secs(60), &stop).unwrap();
            let tmp = std::path::PathBuf::from(done.output.lines().next().unwrap());
            assert_ne!(tmp, std::env::temp_dir(), "the job's TMPDIR is not its own");
            assert_eq!(tmp.join("left").exists(), kept, "exit status {status}");
            if kept {
                assert!(done.output.contains(&format!("kept: {}", tmp.display())));
                std::fs::remove_dir_all(&tmp).unwrap();
            }
        }
    }
}
