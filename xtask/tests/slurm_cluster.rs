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
//! across test processes (see `common::Turn`).

mod common;

use std::path::Path;
use std::process::Command;

use common::{Cluster, TRAIN, build_trainer, text, workspace_root};

/// Trains with two ranks laid out as `layout` says, and checks from the job
/// log that both joined rank 0 on the first node and training finished.
fn train_with_world_size_2(cluster: &Cluster, layout: &[&str]) {
    train_with_world_size_2_via(cluster, layout, "via slurm)");
}

/// [`train_with_world_size_2`], the ranks saying they joined `via`.
fn train_with_world_size_2_via(cluster: &Cluster, layout: &[&str], via: &str) {
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
        let rendezvous = line.contains("master localnode1:") && line.ends_with(via);
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
fn trainer_two_nodes_one_launcher_each() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    // Each node's launcher starts its rank with torchrun's variables.
    let layout = [
        "--nodes",
        "2",
        "--tasks-per-node",
        "1",
        "--layout",
        "per-node",
    ];
    train_with_world_size_2_via(&cluster, &layout, "via torchrun-style environment)");
}

/// `--recovery live` under `slurm-submit --layout per-node` (one launcher
/// per node): a rank of the second node SIGKILLed mid-run; the others, on
/// both nodes, go on without it, its launcher's replacement joins them
/// healed from their memory, and the job ends on the bytes and the sample
/// ledger of one rank trained undisturbed.
#[test]
fn a_live_job_across_two_nodes_loses_a_rank_and_ends_on_one_ranks_bytes() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    build_trainer();
    let tmp = tempfile::tempdir().unwrap();
    let (live, alone) = (tmp.path().join("live"), tmp.path().join("alone"));
    let job = |dir: &Path| -> Vec<String> {
        let flags = "--epochs 1 --max-steps 120 --device cpu --threads 1 --timeout 10 --seed 3 --reproducible --global-batch 32 --unit 8 --eval-samples 500";
        let mut args: Vec<String> = flags.split(' ').map(str::to_string).collect();
        for (flag, path) in [("--checkpoint-dir", "ckpt"), ("--sample-ledger", "ledger")] {
            args.extend([flag.to_string(), dir.join(path).display().to_string()]);
        }
        args
    };
    let steps =
        |dir: &Path| std::fs::read_to_string(dir.join("ledger")).map_or(0, |t| t.lines().count());
    let mut args = vec![
        "--nodes",
        "2",
        "--tasks-per-node",
        "2",
        "--layout",
        "per-node",
        "--",
    ];
    let live_args = job(&live);
    args.extend(live_args.iter().map(String::as_str));
    args.extend(["--recovery", "live", "--max-restarts", "1"]);
    let mut killed = None;
    let submission = cluster.submit_watching(&args, |log| {
        let started = log
            .lines()
            .find_map(|l| l.strip_prefix("launcher: started rank 3 (pid "));
        if let Some(pid) = started.and_then(|r| r.split(')').next())
            && killed.is_none()
            && steps(&live) >= 30
        {
            let sent = Command::new("kill").args(["-KILL", pid]).status().unwrap();
            assert!(sent.success(), "kill -KILL {pid}");
            killed = Some(pid.to_string());
        }
    });
    submission.assert_completed();
    assert!(
        killed.is_some(),
        "rank 3 was never killed:\n{}",
        submission.report()
    );
    submission.assert_log_has("live recovery: lost rank(s) launched as 3");
    submission.assert_log_has("joined: rank(s) launched as 3");
    assert!(
        !submission.log.contains("restart 1 of"),
        "{}",
        submission.report()
    );

    let trainer = workspace_root().join("target/debug/trainer");
    let out = Command::new(trainer).args(job(&alone)).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let read = |dir: &Path, file: &str| std::fs::read(dir.join(file)).unwrap();
    let model = "ckpt/ckpt-e0002-s000000/model.safetensors";
    assert!(
        read(&live, model) == read(&alone, model),
        "the model's bytes:\n{}",
        submission.report()
    );
    assert_eq!(
        read(&live, "ledger"),
        read(&alone, "ledger"),
        "the sample ledger"
    );
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

/// `sbatch --wait slurm/cpu.sbatch --epochs 1` on two nodes with `env`
/// and `path` first on PATH: the job's id and log.
fn cpu_template(cluster: &Cluster, env: &[(&str, &str)], path: Option<&Path>) -> (String, String) {
    let logs = tempfile::tempdir().unwrap();
    let mut search = path.map(Path::to_owned).into_iter().collect::<Vec<_>>();
    search.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let out = Command::new("sbatch")
        .arg("--wait")
        .arg("--nodes=2")
        .arg("--ntasks-per-node=1")
        .arg(format!("--output={}/%j.out", logs.path().display()))
        .arg("slurm/cpu.sbatch")
        .args(["--epochs", "1"])
        .current_dir(workspace_root())
        .envs(env.iter().copied())
        .env("PATH", std::env::join_paths(search).unwrap())
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
    (job_id, log)
}

#[test]
fn cpu_template_runs_under_sbatch() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    // The template's documented override; echo shows what each rank was given.
    let (job_id, log) = cpu_template(&cluster, &[("TRAINER", "/bin/echo")], None);
    let given = format!(
        "--device cpu --threads 1 --checkpoint-dir checkpoints/{job_id} --resume auto --epochs 1"
    );
    let ranks = log.lines().filter(|l| *l == given).count();
    assert_eq!(ranks, 2, "one line per rank expected:\n{log}");
}

#[test]
fn cpu_template_runs_the_trainer_of_an_image() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    // A ch-run that says how it was called (xtask/tests/container.rs runs the real one).
    let bin = tempfile::tempdir().unwrap();
    let fake = bin.path().join("ch-run");
    std::fs::write(&fake, "#!/bin/sh\necho \"ch-run $*\"\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let env = [("CONTAINER", "target/image/fmnist-ddp")];
    let (job_id, log) = cpu_template(&cluster, &env, Some(bin.path()));
    let given = format!(
        "ch-run -b {}:/output --cd /output target/image/fmnist-ddp -- /usr/local/bin/trainer \
         --device cpu --threads 1 --checkpoint-dir checkpoints/{job_id} --resume auto --epochs 1",
        workspace_root().display()
    );
    let ranks = log.lines().filter(|l| *l == given).count();
    assert_eq!(ranks, 2, "one line per rank expected:\n{given}\n{log}");
}
