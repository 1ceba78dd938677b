//! Preemption on a real SLURM cluster: a job whose ranks stop with exit code
//! 75 requeues itself and runs again under the same id, and a trainer job
//! sent USR1 mid-epoch comes back from its checkpoint and ends bit for bit
//! where an undisturbed job does. Skipped like `slurm_cluster.rs` where the
//! cluster cannot run.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::{JoinHandle, sleep};
use std::time::{Duration, Instant};

use common::{Cluster, build_trainer, text};

/// How long a requeued job stays held before the test starts it.
const NUDGE_AFTER: Duration = Duration::from_secs(5);

/// SLURM holds a requeued job back for a couple of minutes (Reason=BeginTime);
/// this starts such jobs early, for as long as it lives. Not at once: the
/// hold lets the node finish cleaning up the job's last run, and a rerun
/// launched into that cleanup failed (exit 1:0, no output) on a loaded
/// machine; a few seconds are enough.
struct StartRequeuedNow {
    done: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl StartRequeuedNow {
    fn on(cluster: &Cluster) -> Self {
        let conf = cluster.state.path().join("slurm.conf");
        let done = Arc::new(AtomicBool::new(false));
        let stop = done.clone();
        let thread = std::thread::spawn(move || {
            let mut held_since = std::collections::HashMap::new();
            while !stop.load(Ordering::Relaxed) {
                let pending = Command::new("squeue")
                    .args(["-h", "-t", "PD", "-o", "%i %r"])
                    .env("SLURM_CONF", &conf)
                    .output();
                for line in pending.map(|o| text(&o.stdout)).unwrap_or_default().lines() {
                    let Some(id) = line.strip_suffix(" BeginTime") else {
                        continue;
                    };
                    let since = *held_since.entry(id.to_owned()).or_insert_with(Instant::now);
                    if since.elapsed() >= NUDGE_AFTER {
                        held_since.remove(id);
                        let _ = Command::new("scontrol")
                            .args(["update", &format!("JobId={id}"), "StartTime=now"])
                            .env("SLURM_CONF", &conf)
                            .status();
                    }
                }
                sleep(Duration::from_millis(500));
            }
        });
        Self {
            done,
            thread: Some(thread),
        }
    }
}

impl Drop for StartRequeuedNow {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[test]
fn a_job_whose_ranks_exit_75_is_requeued_and_runs_again() {
    let Some(cluster) = Cluster::start(1) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let program = tmp.path().join("preempted-once.sh");
    std::fs::write(
        &program,
        "#!/bin/bash\n\
         if [ \"${SLURM_RESTART_COUNT:-0}\" = 0 ]; then echo \"rank $SLURM_PROCID stops\"; exit 75; fi\n\
         echo \"rank $SLURM_PROCID runs again (restart $SLURM_RESTART_COUNT)\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _nudge = StartRequeuedNow::on(&cluster);
    let job = cluster.submit(&[
        "--tasks-per-node",
        "2",
        "--program",
        program.to_str().unwrap(),
    ]);
    job.assert_completed();
    for needle in [
        "rank 0 stops",
        "rank 1 stops",
        &format!("job {} preempted: requeueing it", job.job_id),
        "rank 0 runs again (restart 1)",
        "rank 1 runs again (restart 1)",
    ] {
        job.assert_log_has(needle);
    }
}

/// Two ranks, 12 steps, a checkpoint after each.
const TRAIN: &[&str] = &[
    "--epochs",
    "1",
    "--max-steps",
    "12",
    "--checkpoint-every",
    "1",
    "--device",
    "cpu",
    "--threads",
    "1",
    "--timeout",
    "120",
    "--eval-samples",
    "500",
];

/// The final weights a two-rank job writes to `dir`: the tensor bytes of
/// its `model.safetensors`, after the JSON header (whose metadata keys the
/// safetensors crate writes in hash-map order, so two equal files may differ
/// there).
fn final_weights(dir: &Path) -> Vec<u8> {
    let file = std::fs::read(dir.join("ckpt-e0002-s000000/model.safetensors")).unwrap();
    let header = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    file[8 + header..].to_vec()
}

#[test]
fn a_trainer_job_preempted_mid_epoch_comes_back_and_ends_bitwise_equal() {
    let Some(cluster) = Cluster::start(1) else {
        return;
    };
    build_trainer();
    let tmp = tempfile::tempdir().unwrap();
    let (calm, hit) = (tmp.path().join("calm"), tmp.path().join("hit"));
    let submit = |dir: &Path, extra: &[&str]| {
        let mut args = vec!["--tasks-per-node", "2"];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(TRAIN);
        args.extend(["--checkpoint-dir", dir.to_str().unwrap()]);
        cluster.submit(&args)
    };
    submit(&calm, &[]).assert_completed();

    // Every save pauses a second; once the first exists, USR1 to the ranks.
    let conf = cluster.state.path().join("slurm.conf");
    let first = hit.join("ckpt-e0001-s000001");
    let preempt = std::thread::spawn(move || {
        let start = Instant::now();
        while !first.is_dir() {
            assert!(start.elapsed() < Duration::from_secs(240), "no checkpoint");
            sleep(Duration::from_millis(50));
        }
        let running = Command::new("squeue")
            .args(["-h", "-t", "R", "-o", "%i"])
            .env("SLURM_CONF", &conf)
            .output()
            .unwrap();
        let id = text(&running.stdout).trim().to_owned();
        let sent = Command::new("scancel")
            .args(["--signal=USR1", &id])
            .env("SLURM_CONF", &conf)
            .status()
            .unwrap();
        assert!(sent.success(), "scancel --signal=USR1 {id}");
    });
    let _nudge = StartRequeuedNow::on(&cluster);
    let job = submit(&hit, &["--env", "TRAINER_TEST_PAUSE_IN_SAVE=1"]);
    preempt.join().unwrap();
    job.assert_completed();
    job.assert_log_has("preempted at epoch 1 step ");
    job.assert_log_has("preempted: requeueing it");
    job.assert_log_has("resuming from");
    assert!(
        final_weights(&hit) == final_weights(&calm),
        "the requeued job ended with other weights:\n{}",
        job.report()
    );
}
