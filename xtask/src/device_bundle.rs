//! `cargo xtask device-bundle`: everything a GPU machine without a Rust
//! toolchain needs to check the CUDA backend, in one folder to copy there.
//!
//! ```text
//! device-bundle/
//!   run.sh                 finds the CUDA libraries, runs every step, keeps a summary
//!   bin/trainer            release build
//!   tests/<name>           the parity suite and the trainer's NCCL test (release)
//!   kernels/               every kernel compiled here for sm_90 (kernels.rs)
//!   benches/cnn_layers     each layer's kernels between CUDA events (release)
//!   pytorch/*.py           benches/pytorch: the same measurements in PyTorch
//!   data/fashion-mnist/    the four .gz files (the folder is git-ignored)
//!   build-info.txt         the commit and toolchain it was built from
//!   baseline/bin/trainer   with --baseline REV: the trainer at REV, timed beside
//!   baseline/build-info.txt  this one by run.sh's base_* steps
//! ```
//!
//! Executables are found from cargo's JSON messages, so test and bench
//! binaries keep their names without cargo's hash suffix. The bundle must
//! travel with the checkout in one remote call (64 MiB in all), so it says
//! its size and fails above [`MAX_BUNDLE_MIB`].

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use fashion_mnist::FILES;

mod baseline;
mod kernels;

/// The core-tensor integration test that runs on the GPU.
const GPU_TEST: &str = "cuda_parity";

/// The core-tensor integration test that compiles every kernel with NVRTC
/// and ptxas: run here, its table travels (`kernels/ptxas.txt`).
const NVRTC_TEST: &str = "nvrtc_compile";

/// The bench run.sh times each layer's kernels with.
const BENCH: &str = "cnn_layers";

/// The most the bundle may weigh: a remote call carries 64 MiB, the
/// checkout's tracked files (about 3 MiB) included.
const MAX_BUNDLE_MIB: u64 = 60;

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
    /// A folder holding the NVRTC (`libnvrtc.so.N`) to compile the bundled
    /// kernels with, instead of the nvidia-cuda-nvrtc-cu12 wheel's: the GPU
    /// machine reads the set of the NVRTC version it loads (e.g. a 13.0
    /// wheel's lib folder for a CUDA 13.0 machine); repeatable.
    #[arg(long, value_name = "DIR")]
    nvrtc: Vec<PathBuf>,
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
    let core_tests = artifacts(&[
        "test",
        "--release",
        "--no-run",
        "-p",
        "core-tensor",
        "--test",
        GPU_TEST,
        "--test",
        NVRTC_TEST,
    ])?;
    let (nvrtc_test, gpu_test): (Vec<_>, Vec<_>) =
        core_tests.into_iter().partition(|a| a.name == NVRTC_TEST);
    copy_all(&gpu_test, "tests", &args.out)?;
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
    // Only the bench run.sh runs: the bundle must stay under 60 MiB.
    let benches: Vec<_> = artifacts(&["bench", "--no-run", "-p", "benches"])?
        .into_iter()
        .filter(|a| a.name == BENCH)
        .collect();
    copy_all(&benches, "benches", &args.out)?;
    let nvrtc_test = nvrtc_test
        .first()
        .with_context(|| format!("cargo built no {NVRTC_TEST} test"))?;
    kernels::bundle(&args.out, &nvrtc_test.path, &args.nvrtc)?;
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
    check_size(&args.out)?;
    eprintln!(
        "bundle ready: run ./run.sh in {} on the GPU machine (docs/gpu.md, \"The device bundle\")",
        args.out.display()
    );
    Ok(())
}

/// Prints the bundle's size; fails above [`MAX_BUNDLE_MIB`].
fn check_size(out: &Path) -> Result<()> {
    let mib = dir_bytes(out)? as f64 / f64::from(1 << 20);
    eprintln!("bundle: {mib:.1} MiB in {}", out.display());
    if mib > MAX_BUNDLE_MIB as f64 {
        bail!(
            "the bundle in {} is {mib:.1} MiB, over the {MAX_BUNDLE_MIB} MiB a remote call can \
             carry beside the checkout: leave out --baseline or an --nvrtc",
            out.display()
        );
    }
    Ok(())
}

/// The bytes of the files under `dir`, links not followed.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            total += dir_bytes(&entry.path())?;
        } else if kind.is_file() {
            total += entry.metadata()?.len();
        }
    }
    Ok(total)
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
    let cargo = crate::trainer_build::cargo();
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
        if let Some(built) = crate::trainer_build::executable(line) {
            found.push(Artifact {
                name: built.target,
                path: built.path,
            });
        }
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
    use super::{MAX_BUNDLE_MIB, RUN_SH, check_size};
    use std::process::Command;

    /// A bundle over the limit is an error naming its size; one at the
    /// limit passes (sparse files: no disk written).
    #[test]
    fn a_bundle_over_60_mib_fails() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        let file = std::fs::File::create(dir.path().join("bin/trainer")).unwrap();
        file.set_len(MAX_BUNDLE_MIB << 20).unwrap();
        check_size(dir.path()).unwrap();
        file.set_len((MAX_BUNDLE_MIB << 20) + 1).unwrap();
        let err = check_size(dir.path()).unwrap_err().to_string();
        assert!(err.contains("is 60.0 MiB, over the 60 MiB"), "{err}");
    }

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
