//! Under the real torchrun (PyTorch's `torch.distributed.run`), whose agent
//! hosts the c10d store its workers meet at: one agent's workers train and
//! end bit for bit where this binary's own launcher ends; two agents meet
//! through torchrun's c10d rendezvous and end where `--world-size 4` does;
//! a worker killed under torchrun's `--max-restarts` is restarted from the
//! newest checkpoint; a worker's error is torchrun's "Root Cause".
//!
//! Needs Python with torch: `TORCH_PYTHON`, else `python3`. Without it the
//! tests say so and pass, unless REQUIRE_TORCH=1 (as in CI).

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use comm::launch_var;
use common::{free_port, python_with, run, stderr, trainer, trainer_bin};
use trainer::checkpoint::store::PAUSE_ENV;
use trainer::checkpoint::{MODEL_FILE, Position, load};
use trainer::models::toy::toy_layout;

/// What every run here trains: one epoch of the DDP tutorial's toy model,
/// whose data is made, not read, so that the time goes to the launchers.
const TOY: [&str; 10] = [
    "--model",
    "toy",
    "--samples",
    "2048",
    "--epochs",
    "1",
    "--threads",
    "1",
    "--timeout",
    "60",
];

/// torchrun starting `nproc` workers of this binary on [`TOY`] with
/// `trainer_args`, after its own `torchrun_args`; `None` (the test is
/// skipped) without torch.
fn torchrun(nproc: usize, torchrun_args: &[&str], trainer_args: &[&str]) -> Option<Command> {
    let python = python_with("TORCH_PYTHON", "torch", "REQUIRE_TORCH")?;
    let mut cmd = Command::new(python);
    cmd.args(["-m", "torch.distributed.run", "--nproc-per-node"])
        .arg(nproc.to_string())
        .args(torchrun_args)
        .arg("--no-python")
        .arg(trainer_bin())
        .args(TOY)
        .args(trainer_args);
    // Never inherit a launcher's identity from the test environment.
    for var in launch_var::TORCHRUN {
        cmd.env_remove(var);
    }
    Some(cmd)
}

/// Flags of a short run that checkpoints into `dir`.
fn short_run(dir: &Path, steps: &str) -> Vec<String> {
    let dir = dir.to_str().unwrap().to_string();
    [
        "--device",
        "cpu",
        "--max-steps",
        steps,
        "--checkpoint-dir",
        &dir,
    ]
    .map(String::from)
    .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// The same run by this binary's own launcher, on `world` ranks.
fn built_in(world: usize, args: &[String]) -> Output {
    let out = run(trainer()
        .args(["--world-size", &world.to_string()])
        .args(TOY)
        .args(args));
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

/// Asserts that the runs that wrote `a` and `b` ended in the same final
/// checkpoint: the model's file byte for byte, the state value for value.
fn assert_same_end(a: &Path, b: &Path) {
    let end = |dir: &Path| dir.join(Position { epoch: 2, step: 0 }.dir_name());
    let model = |dir: &Path| std::fs::read(end(dir).join(MODEL_FILE)).unwrap();
    assert!(model(a) == model(b), "the final models differ");
    let state = |dir: &Path| load(&end(dir), toy_layout()).unwrap();
    assert!(state(a) == state(b), "the final states differ");
}

#[test]
fn one_agents_two_workers_meet_at_its_store_and_train_as_the_built_in_launcher() {
    let tmp = tempfile::tempdir().unwrap();
    let args = short_run(&tmp.path().join("torchrun"), "4");
    let Some(mut cmd) = torchrun(2, &["--nnodes", "1"], &strs(&args)) else {
        return;
    };
    let out = run(&mut cmd);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("rank 1/2 joined") && said.contains("via torchrun, at its agent's store"),
        "{said}"
    );
    let ours = short_run(&tmp.path().join("ours"), "4");
    built_in(2, &ours);
    assert_same_end(&tmp.path().join("torchrun"), &tmp.path().join("ours"));
}

#[test]
fn two_agents_meet_by_torchruns_c10d_rendezvous_and_end_as_world_size_four() {
    let tmp = tempfile::tempdir().unwrap();
    let args = short_run(&tmp.path().join("torchrun"), "4");
    let endpoint = format!("127.0.0.1:{}", free_port());
    let rdzv = [
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        &endpoint,
        "--rdzv-id",
        "two-agents",
    ];
    let agent = || {
        torchrun(2, &rdzv, &strs(&args)).map(|mut cmd| {
            cmd.stdout(Stdio::null()).stderr(Stdio::piped());
            cmd
        })
    };
    let Some(mut first) = agent() else {
        return;
    };
    let first = first.spawn().unwrap();
    let second = agent().unwrap().spawn().unwrap();
    let outs = [first, second].map(|agent| agent.wait_with_output().unwrap());
    let said: Vec<String> = outs.iter().map(stderr).collect();
    assert!(outs.iter().all(|o| o.status.success()), "{said:#?}");
    assert!(said.concat().contains("rank 3/4 joined"), "{said:#?}");
    built_in(4, &short_run(&tmp.path().join("ours"), "4"));
    assert_same_end(&tmp.path().join("torchrun"), &tmp.path().join("ours"));
}

/// The pid of the worker of `agent` that torchrun made rank `rank`.
fn worker_pid(agent: &Child, rank: usize) -> Option<u32> {
    let pid = agent.id();
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    children.split_whitespace().find_map(|child| {
        let environ = std::fs::read(format!("/proc/{child}/environ")).ok()?;
        let wanted = format!("RANK={rank}");
        environ
            .split(|&b| b == 0)
            .any(|var| var == wanted.as_bytes())
            .then(|| child.parse().ok())
            .flatten()
    })
}

#[test]
fn a_worker_killed_under_torchruns_max_restarts_resumes_from_the_newest_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let hit = tmp.path().join("hit");
    let mut args = short_run(&hit, "8");
    args.extend(["--checkpoint-every", "2"].map(String::from));
    let Some(mut cmd) = torchrun(2, &["--standalone", "--max-restarts", "1"], &strs(&args)) else {
        return;
    };
    // Every save pauses a second, so that the run is still going when the
    // test, having seen the first checkpoint, kills rank 1.
    let agent = cmd
        .env(PAUSE_ENV, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for_dir(
        &hit.join(Position { epoch: 1, step: 2 }.dir_name()),
        Duration::from_secs(60),
    );
    let pid = worker_pid(&agent, 1).expect("torchrun's rank 1");
    let killed = Command::new("kill").args(["-9", &pid.to_string()]).status();
    assert!(killed.unwrap().success());
    let out = agent.wait_with_output().unwrap();
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("torchrun restart 1: continuing from the newest valid checkpoint")
            && said.contains("resuming from"),
        "{said}"
    );
    let mut calm = short_run(&tmp.path().join("calm"), "8");
    calm.extend(["--checkpoint-every", "2"].map(String::from));
    built_in(2, &calm);
    assert_same_end(&hit, &tmp.path().join("calm"));
}

#[test]
fn a_workers_own_error_is_torchruns_root_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let corrupt = tmp.path().join("ckpt-e0001-s000002");
    std::fs::create_dir(&corrupt).unwrap();
    std::fs::write(corrupt.join(MODEL_FILE), b"not a safetensors file").unwrap();
    let resume = corrupt.to_str().unwrap();
    let Some(mut cmd) = torchrun(
        2,
        &["--standalone"],
        &["--device", "cpu", "--resume", resume],
    ) else {
        return;
    };
    let out = run(&mut cmd);
    let said = stderr(&out);
    assert!(!out.status.success(), "{said}");
    let root_cause = said.split("Root Cause").nth(1).expect("torchrun's summary");
    assert!(
        root_cause.contains("rank      : 0")
            && root_cause.contains(&format!("traceback : rank 0: --resume {resume}"))
            && !root_cause.contains("<N/A>"),
        "{said}"
    );
}

/// The tests that need a GPU each, run on cuda-emu's where there is none.
const EMULATED: [&str; 1] = ["emulated_nccl_ranks_exchange_their_id_at_torchruns_store"];

#[test]
fn nccl_under_torchrun_on_the_cuda_emulator() {
    if python_with("TORCH_PYTHON", "torch", "REQUIRE_TORCH").is_some() {
        common::rerun_on_emulated_gpus(2, &EMULATED);
    }
}

/// NCCL's unique id goes through torchrun's store as the ring's addresses
/// do.
#[test]
fn emulated_nccl_ranks_exchange_their_id_at_torchruns_store() {
    if common::emulated_gpu(0).is_none() {
        return;
    }
    let nccl = ["--device", "cuda", "--backend", "nccl", "--max-steps", "2"];
    let Some(mut cmd) = torchrun(2, &["--standalone"], &nccl) else {
        return;
    };
    let out = run(&mut cmd);
    let said = stderr(&out);
    assert!(out.status.success(), "{said}");
    assert!(
        said.contains("gradients over NCCL") && said.contains("via torchrun, at its agent's store"),
        "{said}"
    );
}
