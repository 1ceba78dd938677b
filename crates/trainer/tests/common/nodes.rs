//! Launchers of a job of several machines, two "machines" on loopback:
//! node 0 and node 1 of a 2 x 2 job, started together.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{data_arg, dataset, free_port, stderr_lines, trainer};

/// One epoch (of `--max-steps`), checkpointed at its end into `dir`.
pub fn job(dir: &Path) -> Command {
    let mut cmd = trainer();
    cmd.args([
        "--epochs",
        "1",
        "--threads",
        "1",
        "--seed",
        "7",
        "--checkpoint-dir",
    ])
    .arg(dir)
    .args(data_arg(dataset()))
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    cmd
}

/// Launchers for nodes 0 and 1 of a 2 x 2 job, started together.
pub fn two_launchers(dir: &Path, extra: &[&str]) -> [Child; 2] {
    two_launchers_with(dir, extra, |_| {})
}

/// [`two_launchers`], each command also set up by `also`.
pub fn two_launchers_with(dir: &Path, extra: &[&str], also: impl Fn(&mut Command)) -> [Child; 2] {
    let port = free_port().to_string();
    [0, 1].map(|node_rank: usize| {
        let mut cmd = job(dir);
        cmd.args(["--nnodes", "2", "--nproc_per_node", "2"])
            .args(["--master_addr", "127.0.0.1", "--master_port", &port])
            .args(["--node_rank", &node_rank.to_string()])
            .args(extra);
        also(&mut cmd);
        cmd.spawn().expect("starting a launcher")
    })
}

/// The same launcher command twice: node ranks by arrival.
pub fn two_same_launchers(dir: &Path, extra: &[&str]) -> [Output; 2] {
    let endpoint = format!("127.0.0.1:{}", free_port());
    [(); 2]
        .map(|()| {
            job(dir)
                .args(["--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d"])
                .args(["--rdzv_id=job7", "--rdzv_endpoint", &endpoint])
                .args(extra)
                .spawn()
                .expect("starting a launcher")
        })
        .map(|l| l.wait_with_output().unwrap())
}

/// A 2 x 2 job of endless steps with `extra` flags, once it trains: both
/// launchers, and node 1's stderr as it comes.
pub fn training_launchers(
    dir: &Path,
    extra: &[&str],
) -> (Child, Child, (Receiver<String>, JoinHandle<()>)) {
    let [node0, mut node1] = two_launchers(dir, &[&["--max-steps", "100000"], extra].concat());
    let (lines, relay) = stderr_lines(&mut node1);
    while !lines
        .recv_timeout(Duration::from_secs(60))
        .expect("the job starts")
        .contains("joined")
    {}
    std::thread::sleep(Duration::from_secs(1));
    (node0, node1, (lines, relay))
}

/// `child`'s output, failing the test if it runs longer than `limit`.
pub fn wait_within(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("a launcher still runs after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// Processes stopped with SIGSTOP, as a frozen machine's are (their
/// connections stay open, silent); dropped, even by a failing test, they
/// are resumed and killed, so that none is left behind.
pub struct Stopped(pub Vec<String>);

impl Stopped {
    pub fn new(pids: Vec<String>) -> Stopped {
        // The guard first: it cleans up whatever the kill below reached.
        let stopped = Stopped(pids);
        let status = Command::new("kill")
            .arg("-STOP")
            .args(&stopped.0)
            .status()
            .unwrap();
        assert!(status.success(), "{:?}", stopped.0);
        stopped
    }

    /// `launcher` and its `workers` workers.
    pub fn machine_of(launcher: &Child, workers: usize) -> Stopped {
        let mut pids = vec![launcher.id().to_string()];
        pids.extend(workers_of(launcher, workers));
        Stopped::new(pids)
    }

    pub fn resume(&self) {
        Command::new("kill")
            .arg("-CONT")
            .args(&self.0)
            .status()
            .unwrap();
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        for signal in ["-CONT", "-KILL"] {
            let _ = Command::new("kill")
                .arg(signal)
                .args(&self.0)
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The pids of `launcher`'s workers, of which there must be `count`.
pub fn workers_of(launcher: &Child, count: usize) -> Vec<String> {
    let pid = launcher.id().to_string();
    let workers = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
    let pids: Vec<String> = super::stdout(&workers)
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(pids.len(), count, "{pids:?}");
    pids
}
