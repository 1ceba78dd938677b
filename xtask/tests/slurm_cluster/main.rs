//! End to end on a real SLURM cluster: `slurm/local-cluster.sh` starts one on
//! this machine and `cargo xtask slurm-submit --wait` runs jobs on it.
//!
//! Needs root and the Debian packages `slurmctld slurmd slurm-client munge`.
//! Without them each test prints that it was skipped and passes, unless
//! REQUIRE_SLURM=1, which turns the skip into a failure. The trainer tests
//! also need the FashionMNIST files where the trainer looks by default
//! (`cargo xtask fetch-data`).
//!
//! The clusters share ports and node names, so the tests take turns, also
//! across test processes (see `Turn`).

use std::fs::File;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Not the script's default port, so a cluster started by hand is left alone.
const PORT: &str = "16817";

/// Enough for the trainer's 20 steps many times over; a hang fails the test
/// instead of blocking the suite.
const DEADLINE: Duration = Duration::from_secs(300);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Bound while a test's cluster exists; see `Turn`.
const TURN_ADDR: &str = "127.0.0.1:16816";

/// Held while a test's cluster exists. The mutex orders this process's tests;
/// the listening socket orders test processes (two people running `cargo test`
/// on one machine), and the kernel frees it even if the process dies.
struct Turn {
    _in_process: MutexGuard<'static, ()>,
    _across_processes: TcpListener,
}

impl Turn {
    fn take() -> Turn {
        let in_process = ONE_AT_A_TIME.lock().unwrap_or_else(PoisonError::into_inner);
        let started = Instant::now();
        let listener = loop {
            match TcpListener::bind(TURN_ADDR) {
                Ok(listener) => break listener,
                Err(_) if started.elapsed() < 2 * DEADLINE => sleep(Duration::from_millis(200)),
                Err(err) => panic!(
                    "waited {:?} to bind {TURN_ADDR} (another test run?): {err}",
                    2 * DEADLINE
                ),
            }
        };
        Turn {
            _in_process: in_process,
            _across_processes: listener,
        }
    }
}

const TRAIN: &[&str] = &[
    "--epochs",
    "1",
    "--max-steps",
    "20",
    "--device",
    "cpu",
    "--threads",
    "1",
    "--timeout",
    "120",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Why the cluster cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if !std::env::split_paths(&path).any(|dir| dir.join("slurmctld").is_file()) {
        return Some("slurmctld is not on PATH".into());
    }
    let uid = Command::new("id").arg("-u").output();
    if !uid.is_ok_and(|out| text(&out.stdout).trim() == "0") {
        return Some("the local cluster needs root (slurmd starts jobs as their user)".into());
    }
    None
}

fn local_cluster(command: &str, state: &Path) -> Command {
    let mut cmd = Command::new(workspace_root().join("slurm/local-cluster.sh"));
    cmd.arg(command)
        .arg("--dir")
        .arg(state)
        .env("LOCAL_SLURM_PORT", PORT);
    cmd
}

struct Cluster {
    state: tempfile::TempDir,
    _turn: Turn,
}

impl Cluster {
    /// Starts a cluster of `nodes` nodes, or returns None when the test is to be skipped.
    fn start(nodes: u32) -> Option<Cluster> {
        if let Some(why) = missing_prerequisite() {
            assert!(
                std::env::var_os("REQUIRE_SLURM").is_none_or(|v| v != "1"),
                "REQUIRE_SLURM=1 but {why}"
            );
            // Written to the stderr handle, not with eprintln!, which the
            // test harness captures and hides for passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "skipped {}: {why}; it needs root and \
                 `apt-get install -y slurmctld slurmd slurm-client munge`",
                std::thread::current().name().unwrap_or("test")
            );
            return None;
        }
        let turn = Turn::take();
        let state = tempfile::Builder::new()
            .prefix("local-slurm-test-")
            .tempdir()
            .unwrap();
        // The cluster's munged runs as the munge user and keeps its socket in here.
        std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let out = local_cluster("start", state.path())
            .args(["--nodes", &nodes.to_string()])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "starting the local cluster failed:\n{}",
            text(&out.stderr)
        );
        Some(Cluster { state, _turn: turn })
    }

    /// Runs `cargo xtask slurm-submit --wait ARGS` against this cluster.
    fn submit(&self, args: &[&str]) -> Submission {
        let logs = tempfile::tempdir().unwrap();
        let stdout = logs.path().join("xtask.stdout");
        let stderr = logs.path().join("xtask.stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["slurm-submit", "--wait", "--time", "10", "--output-dir"])
            .arg(logs.path())
            .args(args)
            .current_dir(workspace_root())
            .env("SLURM_CONF", self.state.path().join("slurm.conf"))
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if started.elapsed() > DEADLINE {
                child.kill().unwrap();
                panic!(
                    "slurm-submit still running after {DEADLINE:?}:\n{}\n{}",
                    std::fs::read_to_string(&stdout).unwrap(),
                    std::fs::read_to_string(&stderr).unwrap()
                );
            }
            sleep(Duration::from_millis(100));
        };
        let output = Output {
            status,
            stdout: std::fs::read(&stdout).unwrap(),
            stderr: std::fs::read(&stderr).unwrap(),
        };
        let stdout = text(&output.stdout);
        let field = |name: &str| {
            stdout
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .unwrap_or_else(|| {
                    panic!("no {name:?} line in:\n{stdout}\n{}", text(&output.stderr))
                })
                .to_owned()
        };
        let job_id = field("job: ");
        let log = std::fs::read_to_string(field("log: ")).unwrap_or_default();
        Submission {
            output,
            job_id,
            log,
            _logs: logs,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        match local_cluster("stop", self.state.path()).output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("stopping the local cluster failed:\n{}", text(&out.stderr)),
            Err(err) => eprintln!("could not run local-cluster.sh stop: {err}"),
        }
    }
}

struct Submission {
    output: Output,
    job_id: String,
    /// The job's log file, as SLURM wrote it.
    log: String,
    _logs: tempfile::TempDir,
}

impl Submission {
    fn report(&self) -> String {
        format!(
            "--- slurm-submit stdout\n{}\n--- stderr\n{}\n--- job log\n{}",
            text(&self.output.stdout),
            text(&self.output.stderr),
            self.log
        )
    }

    fn assert_completed(&self) {
        assert!(
            self.output.status.success(),
            "job did not succeed:\n{}",
            self.report()
        );
        let done = format!("job {} COMPLETED", self.job_id);
        assert!(
            text(&self.output.stdout).contains(&done),
            "{}",
            self.report()
        );
    }

    fn assert_failed(&self) {
        assert!(
            !self.output.status.success(),
            "--wait must exit non-zero:\n{}",
            self.report()
        );
        let failed = format!("job {} ended FAILED with exit code", self.job_id);
        assert!(
            text(&self.output.stderr).contains(&failed),
            "{}",
            self.report()
        );
    }

    fn assert_log_has(&self, needle: &str) {
        assert!(
            self.log.contains(needle),
            "job log lacks {needle:?}:\n{}",
            self.report()
        );
    }
}

/// Builds the release trainer once, outside the per-job deadline; slurm-submit's
/// own build step then finds nothing to do.
fn build_trainer() {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["build", "--release", "-p", "trainer"])
            .current_dir(workspace_root())
            .status()
            .map_err(|e| e.to_string())?;
        status
            .success()
            .then_some(())
            .ok_or(format!("cargo build --release -p trainer: {status}"))
    });
    if let Err(err) = built {
        panic!("cannot build the trainer: {err}");
    }
}

/// Trains with two ranks laid out as `layout` says, and checks from the job
/// log that both joined rank 0 on the first node and training finished.
fn train_with_world_size_2(cluster: &Cluster, layout: &[&str]) {
    build_trainer();
    let mut args = layout.to_vec();
    args.push("--");
    args.extend_from_slice(TRAIN);
    let job = cluster.submit(&args);
    job.assert_completed();
    for rank in 0..2 {
        job.assert_log_has(&format!("rank {rank}/2 joined"));
    }
    let joined: Vec<&str> = job
        .log
        .lines()
        .filter(|l| l.contains(" joined (host "))
        .collect();
    assert_eq!(joined.len(), 2, "one join line per rank:\n{}", job.report());
    for line in joined {
        let rendezvous = line.contains("master localnode1:") && line.ends_with("via slurm)");
        assert!(rendezvous, "rank 0 listens on the first node: {line}");
    }
    job.assert_log_has("Epoch 01/01 | loss ");
    job.assert_log_has("training finished: 1 epoch(s), world size 2");
}

#[test]
fn trainer_one_node_two_ranks() {
    let Some(cluster) = Cluster::start(1) else {
        return;
    };
    train_with_world_size_2(&cluster, &["--nodes", "1", "--tasks-per-node", "2"]);
}

#[test]
fn trainer_two_nodes_one_rank_each() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    train_with_world_size_2(&cluster, &["--nodes", "2", "--tasks-per-node", "1"]);
}

#[test]
fn trainer_failure_fails_the_job() {
    let Some(cluster) = Cluster::start(1) else {
        return;
    };
    build_trainer();
    let mut args = vec!["--tasks-per-node", "2", "--"];
    args.extend_from_slice(TRAIN);
    args.extend_from_slice(&["--data-dir", "/nonexistent"]);
    let job = cluster.submit(&args);
    job.assert_failed();
    job.assert_log_has("error: ");
}

#[test]
fn ranks_get_the_rendezvous_and_env_across_two_nodes() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    let job = cluster.submit(&[
        "--nodes",
        "2",
        "--env",
        "GREETING=hello world",
        "--program",
        "/usr/bin/env",
    ]);
    job.assert_completed();
    let port = 20000 + job.job_id.parse::<u64>().unwrap() % 10000;
    for line in [
        "SLURM_PROCID=0".to_owned(),
        "SLURM_PROCID=1".to_owned(),
        "SLURM_NTASKS=2".to_owned(),
        "SLURMD_NODENAME=localnode2".to_owned(),
        "MASTER_ADDR=localnode1".to_owned(),
        format!("MASTER_PORT={port}"),
        "GREETING=hello world".to_owned(),
    ] {
        job.assert_log_has(&format!("{line}\n"));
    }
}

#[test]
fn failing_program_fails_the_wait() {
    let Some(cluster) = Cluster::start(1) else {
        return;
    };
    let job = cluster.submit(&["--tasks-per-node", "2", "--program", "/bin/false"]);
    job.assert_failed();
    assert!(
        text(&job.output.stderr).contains("exit code 1:0"),
        "{}",
        job.report()
    );
}

#[test]
fn unschedulable_job_is_cancelled_after_the_pending_timeout() {
    let Some(cluster) = Cluster::start(1) else {
        return;
    };
    let job = cluster.submit(&[
        "--nodes",
        "2",
        "--pending-timeout",
        "2",
        "--program",
        "/bin/true",
    ]);
    assert!(!job.output.status.success(), "{}", job.report());
    assert!(
        text(&job.output.stderr).contains("could not be scheduled"),
        "{}",
        job.report()
    );
    let state = Command::new("scontrol")
        .args(["show", "job", "-o", &job.job_id])
        .env("SLURM_CONF", cluster.state.path().join("slurm.conf"))
        .output()
        .unwrap();
    assert!(
        text(&state.stdout).contains("JobState=CANCELLED"),
        "{}",
        text(&state.stdout)
    );
}

#[test]
fn cpu_template_runs_under_sbatch() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    let logs = tempfile::tempdir().unwrap();
    let out = Command::new("sbatch")
        .arg("--wait")
        .arg("--nodes=2")
        .arg("--ntasks-per-node=1")
        .arg(format!("--output={}/%j.out", logs.path().display()))
        .arg("slurm/cpu.sbatch")
        .args(["--epochs", "1"])
        .current_dir(workspace_root())
        // The template's documented override; echo shows what each rank was given.
        .env("TRAINER", "/bin/echo")
        .env("SLURM_CONF", cluster.state.path().join("slurm.conf"))
        .output()
        .unwrap();
    let job_id = text(&out.stdout)
        .trim()
        .strip_prefix("Submitted batch job ")
        .unwrap_or_else(|| panic!("{}\n{}", text(&out.stdout), text(&out.stderr)))
        .to_owned();
    let log = std::fs::read_to_string(logs.path().join(format!("{job_id}.out"))).unwrap();
    assert!(out.status.success(), "{}\n{log}", text(&out.stderr));
    let ranks = log
        .lines()
        .filter(|l| *l == "--device cpu --threads 1 --epochs 1")
        .count();
    assert_eq!(ranks, 2, "one line per rank expected:\n{log}");
}
