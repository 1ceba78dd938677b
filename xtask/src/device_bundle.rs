//! `cargo xtask device-bundle`: everything a GPU machine without a Rust
//! toolchain needs to check the CUDA backend, in one folder to copy there.
//!
//! ```text
//! device-bundle/
//!   run.sh                 finds the CUDA libraries, runs every check, prints a summary
//!   bin/trainer            release build
//!   tests/<name>           core-tensor's GPU test executables (release)
//!   benches/<name>         the bench executables (release)
//!   pytorch/*.py           benches/pytorch: the same measurements in PyTorch
//!   data/fashion-mnist/    the four .gz files (the folder is git-ignored)
//!   build-info.txt         the commit and toolchain it was built from
//!   baseline/bin/trainer   with --baseline REV: the trainer at REV, timed beside
//!   baseline/build-info.txt  this one by run.sh's base_* steps
//! ```
//!
//! Executables are found from cargo's JSON messages, so test and bench
//! binaries keep their names without cargo's hash suffix.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use fashion_mnist::FILES;

mod baseline;

/// The core-tensor integration tests that exercise a GPU (or NVRTC).
const GPU_TESTS: [&str; 2] = ["cuda_parity", "nvrtc_compile"];

/// The trainer's integration test that exercises NCCL on a GPU.
const TRAINER_GPU_TEST: &str = "nccl_gpu";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Folder to (re)create the bundle in.
    #[arg(long, default_value = "device-bundle", value_name = "DIR")]
    out: PathBuf,
    /// Folder holding the four FashionMNIST .gz files to bundle [default:
    /// data/fashion-mnist/, else /usr/share/datasets/fashion-mnist/].
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Also bundle the trainer built at this git revision (a commit, tag or
    /// branch), so that one device session times both builds on one GPU.
    #[arg(long, value_name = "REV")]
    baseline: Option<String>,
}

pub fn run(args: Args) -> Result<()> {
    if let Some(rev) = &args.baseline {
        baseline::check(rev)?;
    }
    let data = fashion_mnist::locate(args.data_dir.as_deref())
        .context("the bundle carries the data set: pass --data-dir or fetch it first")?;
    fresh_dir(&args.out)?;
    let trainer = artifacts(&["build", "--release", "-p", "trainer", "--bin", "trainer"])?;
    copy_all(&trainer, "bin", &args.out)?;
    let mut test_args = vec!["test", "--release", "--no-run", "-p", "core-tensor"];
    for test in GPU_TESTS {
        test_args.extend(["--test", test]);
    }
    copy_all(&artifacts(&test_args)?, "tests", &args.out)?;
    let trainer_test = [
        "test",
        "--release",
        "--no-run",
        "-p",
        "trainer",
        "--test",
        TRAINER_GPU_TEST,
    ];
    // Cargo also reports the trainer binary the test runs; the bundle has it.
    let nccl_test: Vec<_> = artifacts(&trainer_test)?
        .into_iter()
        .filter(|a| a.name == TRAINER_GPU_TEST)
        .collect();
    copy_all(&nccl_test, "tests", &args.out)?;
    copy_all(
        &artifacts(&["bench", "--no-run", "-p", "benches"])?,
        "benches",
        &args.out,
    )?;
    copy_pytorch(&args.out.join("pytorch"))?;
    let data_out = args.out.join("data/fashion-mnist");
    std::fs::create_dir_all(&data_out)?;
    for file in &FILES {
        std::fs::copy(data.join(file.name), data_out.join(file.name))
            .with_context(|| format!("copying {}", file.name))?;
    }
    std::fs::write(
        args.out.join("build-info.txt"),
        build_info(&workspace_root()),
    )?;
    if let Some(rev) = &args.baseline {
        baseline::bundle(rev, &args.out)?;
    }
    let script = args.out.join("run.sh");
    std::fs::write(&script, RUN_SH)?;
    make_executable(&script)?;
    eprintln!(
        "bundle ready: copy {} to the GPU machine and run ./run.sh there (docs/gpu.md)",
        args.out.display()
    );
    Ok(())
}

/// Empties `dir`, refusing a non-empty folder that is not an earlier bundle.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        let empty = std::fs::read_dir(dir)?.next().is_none();
        if !empty && !dir.join("run.sh").is_file() {
            bail!(
                "{} exists and is not a device bundle; not touching it",
                dir.display()
            );
        }
        std::fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// One executable cargo built: its target name and path.
struct Artifact {
    name: String,
    path: PathBuf,
}

/// Runs `cargo <args> --message-format=json` and collects the executables.
///
/// Built without symbols or debug info, in a target folder of their own (so
/// ordinary release builds are not redone): stripped, the executables are a
/// tenth of their size, and the bundle with the data stays under the 64 MiB
/// a device session can carry.
fn artifacts(args: &[&str]) -> Result<Vec<Artifact>> {
    artifacts_in(&workspace_root(), &target_dir().join("device-bundle"), args)
}

/// This workspace's root.
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Cargo's target folder for this workspace.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| workspace_root().join("target"), PathBuf::from)
}

/// [`artifacts`] for the workspace at `root`, built into `target`.
fn artifacts_in(root: &Path, target: &Path, args: &[&str]) -> Result<Vec<Artifact>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("cargo {} (in {})", args.join(" "), root.display());
    let out = Command::new(cargo)
        .current_dir(root)
        .args(args)
        .arg("--target-dir")
        .arg(target)
        .envs(["RELEASE", "BENCH"].iter().flat_map(|profile| {
            [
                (format!("CARGO_PROFILE_{profile}_STRIP"), "symbols"),
                (format!("CARGO_PROFILE_{profile}_DEBUG"), "false"),
            ]
        }))
        .arg("--message-format=json-render-diagnostics")
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo")?;
    if !out.status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(path), Some(name)) = (msg["executable"].as_str(), msg["target"]["name"].as_str())
        else {
            continue;
        };
        found.push(Artifact {
            name: name.to_owned(),
            path: path.into(),
        });
    }
    if found.is_empty() {
        bail!("cargo {} built no executable", args.join(" "));
    }
    Ok(found)
}

fn copy_all(artifacts: &[Artifact], sub: &str, out: &Path) -> Result<()> {
    let dir = out.join(sub);
    std::fs::create_dir_all(&dir)?;
    for a in artifacts {
        std::fs::copy(&a.path, dir.join(&a.name))
            .with_context(|| format!("copying {}", a.path.display()))?;
    }
    Ok(())
}

/// Copies the PyTorch comparison scripts, `benches/pytorch/*.py`, into `dir`.
fn copy_pytorch(dir: &Path) -> Result<()> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/pytorch");
    std::fs::create_dir_all(dir)?;
    let mut copied = 0;
    for entry in std::fs::read_dir(&src).with_context(|| format!("reading {}", src.display()))? {
        let path = entry?.path();
        let Some(name) = path.file_name() else {
            continue;
        };
        if path.extension().is_some_and(|ext| ext == "py") {
            std::fs::copy(&path, dir.join(name))
                .with_context(|| format!("copying {}", path.display()))?;
            copied += 1;
        }
    }
    if copied == 0 {
        bail!("no PyTorch scripts in {}", src.display());
    }
    Ok(())
}

/// The commit of the tree at `root` (marked when it had changes) and the
/// toolchain.
fn build_info(root: &Path) -> String {
    let run = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "unknown".into())
    };
    format!(
        "commit {}\n{}\n",
        run("git", &["describe", "--always", "--dirty"]),
        run("rustc", &["--version"])
    )
}

#[cfg(unix)]
fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

#[cfg(not(unix))]
fn make_executable(_: &Path) -> Result<()> {
    Ok(())
}

/// The script run on the GPU machine (shellchecked by `tests/tidy`).
const RUN_SH: &str = include_str!("device_bundle/run.sh");

#[cfg(test)]
mod tests {
    use super::RUN_SH;
    use std::process::Command;

    /// `bash -n` accepts the run.sh the bundle gets (shellcheck checks it with
    /// every other script, in `tests/tidy`).
    #[test]
    fn run_sh_parses() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("run.sh");
        std::fs::write(&script, RUN_SH).unwrap();
        let bash = Command::new("bash").arg("-n").arg(&script).output();
        let bash = bash.expect("running bash");
        assert!(
            bash.status.success(),
            "bash -n run.sh: {}",
            String::from_utf8_lossy(&bash.stderr)
        );
    }
}
