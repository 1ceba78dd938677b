//! Signals to a running job, with real processes: whatever reaches the
//! launcher (SIGINT, SIGTERM, even SIGKILL), no rank of the job outlives it;
//! SIGTERM to the launcher or SIGUSR1 to one worker saves a mid-epoch
//! checkpoint from which `--resume auto` ends exactly where an undisturbed
//! run does.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::{
    data_arg, dataset, final_state, job, launcher_pid, run, stderr, stderr_lines, trainer,
};
use launcher::contract::PREEMPTED_EXIT_CODE;
use trainer::checkpoint::Position;
use trainer::checkpoint::store::PAUSE_ENV;

/// How long a stopped job may take to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(15);

/// A two-rank job launched by the trainer itself, with its stderr piped.
struct Job {
    launcher: Child,
    lines: Receiver<String>,
    log: Vec<String>,
    relay: Option<std::thread::JoinHandle<()>>,
}

impl Job {
    fn start(cmd: &mut Command) -> Job {
        let mut launcher = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (lines, relay) = stderr_lines(&mut launcher);
        Job {
            launcher,
            lines,
            log: Vec::new(),
            relay: Some(relay),
        }
    }

    /// Reads stderr until a line satisfies `found`; what it returns.
    fn wait_for<T>(&mut self, what: &str, found: impl Fn(&str) -> Option<T>) -> T {
        loop {
            let line = self.lines.recv_timeout(Duration::from_secs(60));
            let line = line.unwrap_or_else(|_| panic!("waiting for {what}:\n{}", self.log()));
            let hit = found(&line);
            self.log.push(line);
            if let Some(hit) = hit {
                return hit;
            }
        }
    }

    fn worker_pids(&mut self) -> [u32; 2] {
        [0, 1].map(|rank| {
            self.wait_for(&format!("rank {rank}'s pid"), |l| launcher_pid(l, rank))
                .parse()
                .unwrap()
        })
    }

    fn signal_launcher(&self, signal: &str) {
        send(signal, self.launcher.id());
    }

    /// The launcher's exit status, within [`GONE_WITHIN`].
    fn wait(&mut self) -> ExitStatus {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.launcher.try_wait().unwrap() {
                break status;
            }
            if start.elapsed() > GONE_WITHIN {
                let _ = self.launcher.kill();
                panic!("the launcher is still running:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Some(relay) = self.relay.take() {
            relay.join().unwrap();
        }
        let rest: Vec<String> = self.lines.try_iter().collect();
        self.log.extend(rest);
        status
    }

    fn log(&self) -> String {
        self.log.join("\n")
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        let _ = self.launcher.kill();
        let _ = self.launcher.wait();
    }
}

fn send(signal: &str, pid: u32) {
    let sent = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{signal} {pid}");
}

/// Running, that is: in /proc and not a zombie.
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

fn assert_gone(pids: &[u32], log: &str) {
    let start = Instant::now();
    while pids.iter().any(|&pid| alive(pid)) {
        assert!(
            start.elapsed() < GONE_WITHIN,
            "workers {pids:?} still alive {GONE_WITHIN:?} later:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A long two-rank run, to be stopped long before it ends.
fn long_run() -> Command {
    let mut cmd = job(2, 50, 10);
    cmd.args(["--grace", "5"]);
    cmd
}

/// Starts a long run and returns once rank 0 trains, with the worker pids.
fn started_long_run() -> (Job, [u32; 2]) {
    let mut job = Job::start(&mut long_run());
    let pids = job.worker_pids();
    job.wait_for("training to start", |l| {
        l.starts_with("[rank 0] training on").then_some(())
    });
    (job, pids)
}

#[test]
fn sigint_to_the_launcher_stops_every_rank() {
    let (mut job, pids) = started_long_run();
    job.signal_launcher("INT");
    let status = job.wait();
    assert_gone(&pids, &job.log());
    assert_eq!(status.code(), Some(130), "{}", job.log());
}

#[test]
fn sigterm_to_the_launcher_stops_every_rank() {
    let (mut job, pids) = started_long_run();
    job.signal_launcher("TERM");
    let status = job.wait();
    assert_gone(&pids, &job.log());
    // 75 once the ranks stop on the request themselves (nothing to save
    // here), 143 if the launcher had to kill them after --grace.
    assert!(
        [Some(PREEMPTED_EXIT_CODE), Some(143)].contains(&status.code()),
        "{status}\n{}",
        job.log()
    );
    assert!(!job.log().contains("restart"), "{}", job.log());
}

/// Ctrl-C to one worker (say, in a debugger's terminal) stops the job as
/// Ctrl-C to the launcher would: every rank, exit 130, no restart.
#[test]
fn sigint_to_one_worker_stops_the_job_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = long_run();
    run.args(["--max-restarts", "2", "--checkpoint-dir"])
        .arg(dir.path().join("ckpt"));
    let mut job = Job::start(&mut run);
    let pids = job.worker_pids();
    job.wait_for("training to start", |l| {
        l.starts_with("[rank 0] training on").then_some(())
    });
    send("INT", pids[1]);
    let status = job.wait();
    let log = job.log();
    assert_gone(&pids, &log);
    assert_eq!(status.code(), Some(130), "{log}");
    assert!(log.contains("rank 1 was interrupted"), "{log}");
    assert!(!log.contains("restart"), "{log}");
}

#[test]
fn sigkill_to_the_launcher_takes_the_ranks_with_it() {
    let (mut job, pids) = started_long_run();
    job.signal_launcher("KILL");
    job.wait();
    assert_gone(&pids, &job.log());
}

/// Two ranks, 12 steps of one epoch, a checkpoint after every step; every
/// save pauses a second, so a test can signal the job mid-epoch.
fn checkpointed(dir: &Path) -> Command {
    let mut cmd = job(2, 1, 20);
    cmd.args([
        "--max-steps",
        "12",
        "--checkpoint-every",
        "1",
        "--checkpoint-dir",
    ])
    .arg(dir);
    cmd
}

/// Signals a checkpointed run (via `send`) once its first checkpoint exists,
/// checks that it stopped mid-epoch with a checkpoint and the documented
/// line, then resumes it and compares with an undisturbed run.
fn preempt_then_resume(send_signal: impl FnOnce(&Job, [u32; 2])) {
    let tmp = tempfile::tempdir().unwrap();
    let (calm, hit) = (tmp.path().join("calm"), tmp.path().join("hit"));
    let out = run(&mut checkpointed(&calm));
    assert!(out.status.success(), "{}", stderr(&out));

    let mut job = Job::start(checkpointed(&hit).env(PAUSE_ENV, "1"));
    let pids = job.worker_pids();
    let first = hit.join(Position { epoch: 1, step: 1 }.dir_name());
    let start = Instant::now();
    while !first.is_dir() {
        assert!(start.elapsed() < Duration::from_secs(60), "no checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    send_signal(&job, pids);
    let status = job.wait();
    let log = job.log();
    assert_gone(&pids, &log);
    assert_eq!(status.code(), Some(PREEMPTED_EXIT_CODE), "{log}");
    let line = log
        .lines()
        .find_map(|l| l.split("preempted at epoch 1 step ").nth(1))
        .unwrap_or_else(|| panic!("no preemption line:\n{log}"));
    let step: u64 = line.split(';').next().unwrap().trim().parse().unwrap();
    assert!((1..12).contains(&step), "not mid-epoch: step {step}\n{log}");
    assert!(line.contains("resume with --resume auto"), "{log}");
    let saved = hit.join(Position { epoch: 1, step }.dir_name());
    assert!(
        saved.is_dir(),
        "no checkpoint at {}\n{log}",
        saved.display()
    );
    assert!(!hit.join(Position { epoch: 2, step: 0 }.dir_name()).exists());

    let out = run(checkpointed(&hit).args(["--resume", "auto"]));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        final_state(&hit) == final_state(&calm),
        "the resumed run ended elsewhere\n{log}\n{}",
        stderr(&out)
    );
}

#[test]
fn sigterm_to_the_launcher_saves_mid_epoch_and_resume_ends_bitwise_equal() {
    preempt_then_resume(|job, _| job.signal_launcher("TERM"));
}

#[test]
fn sigusr1_to_one_worker_saves_mid_epoch_and_resume_ends_bitwise_equal() {
    preempt_then_resume(|_, pids| send("USR1", pids[1]));
}

/// As SLURM and systemd do: every process of the job gets the signal, so
/// each worker gets it twice (itself, and from the launcher), which must
/// still be one preemption, not a second signal's stop at once.
#[test]
fn sigterm_to_every_process_at_once_is_one_preemption() {
    preempt_then_resume(|job, pids| {
        send("TERM", pids[0]);
        send("TERM", pids[1]);
        job.signal_launcher("TERM");
    });
}

/// Waits for a lone worker at most [`GONE_WITHIN`].
fn exit_within(child: &mut Child) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > GONE_WITHIN {
            let _ = child.kill();
            panic!("the worker is still running {GONE_WITHIN:?} later");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_second_signal_stops_a_worker_at_once_even_with_its_stderr_gone() {
    let mut worker = trainer()
        .args(["--epochs", "50", "--threads", "1"])
        .args(data_arg(dataset()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(worker.stderr.take().unwrap()).lines();
    let started = said.any(|l| l.is_ok_and(|l| l.starts_with("training on")));
    assert!(started, "the worker never said it trains");
    // Whoever read its stderr is gone, as when its launcher died.
    drop(said);
    let pid = worker.id();
    // Another signal than the first: a repeat of the first this soon would
    // count as the same request delivered twice.
    send("INT", pid);
    send("TERM", pid);
    let status = exit_within(&mut worker);
    // 143 from the second signal; 130 if the training loop, stopping on the
    // first, was quicker.
    assert!([Some(143), Some(130)].contains(&status.code()), "{status}");
}

#[test]
fn sigint_stops_a_lone_worker_promptly() {
    let mut cmd = trainer();
    cmd.args(["--epochs", "50", "--threads", "1"])
        .args(data_arg(dataset()));
    let mut job = Job::start(&mut cmd);
    job.wait_for("training to start", |l| {
        l.starts_with("training on").then_some(())
    });
    send("INT", job.launcher.id());
    let status = exit_within(&mut job.launcher);
    assert_eq!(status.code(), Some(130), "{status}\n{}", job.log());
}

/// A run whose output nobody reads any more (a `| head` that exited, a
/// dead `tee` or ssh session) trains to its end: the launcher's relay and
/// rank 0's epoch lines drop what they cannot write.
#[test]
fn a_run_whose_readers_are_gone_trains_to_the_end() {
    let mut launcher = job(2, 2, 30)
        .args(["--max-steps", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(launcher.stdout.take());
    drop(launcher.stderr.take());
    let start = Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > Duration::from_secs(180) {
            let _ = launcher.kill();
            panic!("still running after 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

/// SIGTERM to a rank still waiting for its peers (or loading data) ends it
/// at once with 75, nothing being lost yet, instead of after the
/// rendezvous' --timeout.
#[test]
fn sigterm_before_training_begins_exits_75_at_once() {
    use comm::launch_var;
    let mut lone = trainer()
        .env(launch_var::RANK, "0")
        .env(launch_var::WORLD_SIZE, "2")
        .env(launch_var::MASTER_ADDR, "127.0.0.1")
        .env(launch_var::MASTER_PORT, common::free_port().to_string())
        .args(["--epochs", "1", "--threads", "1", "--timeout", "120"])
        .args(data_arg(dataset()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = BufReader::new(lone.stderr.take().unwrap()).lines();
    let waiting = said.any(|l| l.is_ok_and(|l| l.contains("auth token")));
    assert!(waiting, "the rank never reached the rendezvous");
    send("TERM", lone.id());
    // Within GONE_WITHIN, far before the rendezvous' 120 s.
    let status = exit_within(&mut lone);
    assert_eq!(status.code(), Some(PREEMPTED_EXIT_CODE), "{status}");
    let rest: Vec<String> = said.map_while(Result::ok).collect();
    assert!(
        rest.iter()
            .any(|l| l.contains("stopping before training began")),
        "{rest:?}"
    );
}

/// A worker the launcher starts holds SIGTERM pending until its handlers
/// are in place (`die_with_parent` starts it with the signal blocked), so
/// a signal in its first milliseconds is a preemption, not a kill (143).
#[test]
fn sigterm_the_instant_a_worker_starts_is_still_a_preemption() {
    let mut cmd = trainer();
    cmd.args(["--epochs", "50", "--threads", "1"])
        .args(data_arg(dataset()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    launcher::contract::die_with_parent(&mut cmd);
    let mut worker = cmd.spawn().unwrap();
    send("TERM", worker.id());
    let status = exit_within(&mut worker);
    assert_eq!(status.code(), Some(PREEMPTED_EXIT_CODE), "{status}");
}
