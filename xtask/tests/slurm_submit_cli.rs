//! `cargo xtask slurm-submit` as a user runs it, without a SLURM cluster:
//! dry runs, input validation and the missing-sbatch message.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn slurm_submit(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_xtask"));
    cmd.arg("slurm-submit")
        .args(args)
        .current_dir(workspace_root());
    cmd
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn expect_failure(out: &Output, message: &str) {
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "expected a failure, got success:\n{}",
        text(&out.stdout)
    );
    assert!(
        stderr.contains(message),
        "expected {message:?} in stderr:\n{stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "a user error must not panic:\n{stderr}"
    );
}

#[test]
fn dry_run_prints_the_script_and_touches_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let out = slurm_submit(&[
        "--dry-run",
        "--nodes=2",
        "--gpus-per-node=4",
        "--time=1-00",
        "--env=NCCL_DEBUG=INFO",
        "--output-dir",
        logs.to_str().unwrap(),
        "--",
        "--epochs",
        "3",
    ])
    .output()
    .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    let root = workspace_root();
    for line in [
        "#SBATCH --nodes=2".to_owned(),
        "#SBATCH --ntasks-per-node=4".to_owned(),
        "#SBATCH --gpus-per-node=4".to_owned(),
        "#SBATCH --time=1-00".to_owned(),
        format!("#SBATCH --chdir={}", root.display()),
        format!("#SBATCH --output={}/fmnist-ddp-%j.out", logs.display()),
        "export NCCL_DEBUG=INFO".to_owned(),
    ] {
        assert!(
            stdout.lines().any(|l| l == line),
            "missing {line:?} in:\n{stdout}"
        );
    }
    let srun = stdout.lines().find(|l| l.starts_with("srun ")).unwrap();
    // A requeued job continues from the job's checkpoints.
    assert!(
        srun.ends_with(
            r#"/release/trainer --checkpoint-dir "$CHECKPOINT_DIR" --resume auto --epochs 3 || status=$?"#
        ),
        "{srun}"
    );
    for line in ["#SBATCH --signal=USR1@120", "#SBATCH --requeue"] {
        assert!(stdout.lines().any(|l| l == line), "missing {line:?}");
    }
    assert!(
        !logs.exists(),
        "a dry run must not create the output directory"
    );
}

/// `--profile dev` submits cargo's dev build, which `cargo test` has
/// already built; a custom profile its own folder.
#[test]
fn the_profile_picks_the_trainer_build() {
    for (profile, folder) in [("dev", "debug"), ("release", "release"), ("fast", "fast")] {
        let out = slurm_submit(&["--dry-run", "--profile", profile])
            .output()
            .unwrap();
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
        let srun = stdout.lines().find(|l| l.starts_with("srun ")).unwrap();
        assert!(srun.contains(&format!("/{folder}/trainer ")), "{srun}");
    }
}

#[test]
fn rejects_invalid_input_before_doing_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    let cases: &[(&[&str], &str)] = &[
        (&["--nodes=0"], "--nodes must be at least 1"),
        (&["--time=2h"], "invalid --time \"2h\""),
        (&["--time=10:75"], "seconds must be below 60"),
        (&["--partition=gpu; rm -rf ~"], "invalid --partition"),
        (&["--job-name=my job"], "invalid --job-name"),
        (&["--env=NCCL_DEBUG"], "expected KEY=VALUE"),
        (&["--gpus-per-node=2", "--tasks-per-node=2"], "not both"),
        (
            &["--time=2", "--signal-secs=120"],
            "must be below the --time limit",
        ),
        (&["--signal-secs=0"], "--signal-secs must be at least 1"),
        (
            // sbatch's --signal takes 0 to 65535 seconds; a longer --time
            // must not make a larger value pass.
            &["--time=2-00", "--signal-secs=100000"],
            "--signal-secs 100000 is above 65535",
        ),
        (
            &["--dry-run", "--program=/nonexistent/wrapper"],
            "no such file",
        ),
        (
            &["--dry-run", "--profile=release; rm -rf ~"],
            "is not a cargo profile name",
        ),
    ];
    for (args, message) in cases {
        let mut cmd = slurm_submit(args);
        cmd.args(["--output-dir", logs.to_str().unwrap()]);
        expect_failure(&cmd.output().unwrap(), message);
    }
    assert!(
        !logs.exists(),
        "rejected input must not create the output directory"
    );
}

/// A user mistake is one `error:` line with its causes and exit status 1,
/// also with RUST_BACKTRACE set in the user's shell: no stack backtrace.
#[test]
fn a_user_error_prints_one_line_without_a_backtrace() {
    let out = slurm_submit(&["--dry-run", "--nodes=0"])
        .env("RUST_BACKTRACE", "1")
        .env("RUST_LIB_BACKTRACE", "1")
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr, "error: --nodes must be at least 1\n");
    assert!(!stderr.to_lowercase().contains("backtrace"), "{stderr}");
}

#[test]
fn rejects_an_output_dir_sbatch_cannot_carry() {
    let out = slurm_submit(&["--dry-run", "--output-dir", "/tmp/my logs"])
        .output()
        .unwrap();
    expect_failure(&out, "cannot carry");
}

#[test]
fn explains_a_missing_sbatch() {
    let out = slurm_submit(&["--program=/bin/true"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    expect_failure(&out, "`sbatch` is not on PATH");
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("login node") && stderr.contains("apt-get install slurm-client"),
        "{stderr}"
    );
}
