//! A local SLURM cluster for the tests: `slurm/local-cluster.sh` starts one
//! on this machine and `cargo xtask slurm-submit --wait` runs jobs on it.
//! The clusters share ports and node names, so the tests take turns, also
//! across test processes (see `Turn`).
#![allow(dead_code)] // each test binary uses its own subset

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
pub const DEADLINE: Duration = Duration::from_secs(300);

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Bound while a test's cluster exists; see `Turn`.
const TURN_ADDR: &str = "127.0.0.1:16816";

/// Held while a test's cluster exists. The mutex orders this process's tests;
/// the listening socket orders test processes (two people running `cargo test`
/// on one machine), and the kernel frees it even if the process dies.
pub struct Turn {
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

pub const TRAIN: &[&str] = &[
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
    // Evaluation on 500 test images, not 10,000: the tests read the model
    // and the log, not the accuracy.
    "--eval-samples",
    "500",
];

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

pub fn text(bytes: &[u8]) -> String {
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

/// Says that the running test is skipped because of `why`, or fails it
/// when the environment's `require` is 1; it needs root and `packages`.
pub fn skip(require: &str, why: &str, packages: &str) {
    assert!(
        std::env::var_os(require).is_none_or(|v| v != "1"),
        "{require}=1 but {why}"
    );
    // Written to the stderr handle, not with eprintln!, which the test
    // harness captures and hides for passing tests.
    let _ = writeln!(
        std::io::stderr(),
        "skipped {}: {why}; it needs root and `apt-get install -y {packages}`",
        std::thread::current().name().unwrap_or("test")
    );
}

pub struct Cluster {
    pub state: tempfile::TempDir,
    _turn: Turn,
}

impl Cluster {
    /// Starts a cluster of `nodes` nodes, or returns None when the test is to be skipped.
    pub fn start(nodes: u32) -> Option<Cluster> {
        if let Some(why) = missing_prerequisite() {
            skip("REQUIRE_SLURM", &why, "slurmctld slurmd slurm-client munge");
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
    pub fn submit(&self, args: &[&str]) -> Submission {
        self.submit_watching(args, |_| {})
    }

    /// [`Cluster::submit`], showing `watch` the job's log as it grows
    /// (every 100 ms while the job runs), to act on the job meanwhile.
    pub fn submit_watching(&self, args: &[&str], mut watch: impl FnMut(&str)) -> Submission {
        let logs = tempfile::tempdir().unwrap();
        let stdout = logs.path().join("xtask.stdout");
        let stderr = logs.path().join("xtask.stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["slurm-submit", "--wait", "--time", "10", "--profile", "dev"])
            .arg("--output-dir")
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
            let submitted = std::fs::read_to_string(&stdout).unwrap_or_default();
            if let Some(log) = submitted.lines().find_map(|l| l.strip_prefix("log: ")) {
                watch(&std::fs::read_to_string(log).unwrap_or_default());
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

pub struct Submission {
    pub output: Output,
    pub job_id: String,
    /// The job's log file, as SLURM wrote it.
    pub log: String,
    _logs: tempfile::TempDir,
}

impl Submission {
    pub fn report(&self) -> String {
        format!(
            "--- slurm-submit stdout\n{}\n--- stderr\n{}\n--- job log\n{}",
            text(&self.output.stdout),
            text(&self.output.stderr),
            self.log
        )
    }

    pub fn assert_completed(&self) {
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

    pub fn assert_failed(&self) {
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

    pub fn assert_log_has(&self, needle: &str) {
        assert!(
            self.log.contains(needle),
            "job log lacks {needle:?}:\n{}",
            self.report()
        );
    }
}

/// Builds the trainer once, outside the per-job deadline; slurm-submit's
/// own build step then finds nothing to do. Cargo's dev profile, which the
/// jobs run (`--profile dev`): after `cargo test --workspace` it is built
/// already (the trainer names the features `cargo test` resolves), where a
/// release build takes three minutes; `cargo test -p xtask` alone builds it
/// here.
pub fn build_trainer() {
    static BUILT: OnceLock<Result<(), String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
            .args(["build", "--profile", "dev", "-p", "trainer"])
            .current_dir(workspace_root())
            .status()
            .map_err(|e| e.to_string())?;
        status
            .success()
            .then_some(())
            .ok_or(format!("cargo build --profile dev -p trainer: {status}"))
    });
    if let Err(err) = built {
        panic!("cannot build the trainer: {err}");
    }
}
