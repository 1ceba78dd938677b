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
//! ```
//!
//! Executables are found from cargo's JSON messages, so test and bench
//! binaries keep their names without cargo's hash suffix.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};
use fashion_mnist::FILES;

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
}

pub fn run(args: Args) -> Result<()> {
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
    std::fs::write(args.out.join("build-info.txt"), build_info())?;
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
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("device-bundle");
    eprintln!("cargo {}", args.join(" "));
    let out = Command::new(cargo)
        .current_dir(&root)
        .args(args)
        .arg("--target-dir")
        .arg(&target)
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

/// The commit (marked when the tree had changes) and the toolchain.
fn build_info() -> String {
    let run = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
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

/// The script run on the GPU machine.
const RUN_SH: &str = r#"#!/usr/bin/env bash
# The CUDA checks of this device bundle (built by `cargo xtask device-bundle`,
# see docs/gpu.md). Usage:
#   ./run.sh [--data-dir DIR] [--epochs N] [--budget SECS] [--only REGEX] [--logs DIR]
#
# Needs the NVIDIA driver, and NVRTC from a CUDA toolkit or a pip wheel (a
# PyTorch venv has one: run with that python on PATH or PYTHON=.../python);
# with a PyTorch that sees the GPU it also times PyTorch on the same model.
# Each step gets at most 600 s and all steps together --budget seconds
# (default 900): a step is stopped when the budget runs out, and skipped
# when less than 30 s of it is left.
# --only runs just the steps whose names match the (bash) regex.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data_dir="$here/data/fashion-mnist"
epochs=5
budget=900
only=
logs="$here/logs"
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) data_dir=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --logs) logs=$2; shift 2 ;;
    *) echo "usage: $0 [--data-dir DIR] [--epochs N] [--budget SECS] [--only REGEX] [--logs DIR]" >&2; exit 2 ;;
  esac
done
deadline=$((SECONDS + budget))
links="$here/lib"
mkdir -p "$logs" "$links"
python=${PYTHON:-python3}
# PyTorch runs with the caller's library path: it brings its own NCCL and NVRTC.
orig_ld=${LD_LIBRARY_PATH-}
summary=()
failed=0
row() { summary+=("$(printf '%-22s %-7s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && failed=1; }
# Whether --only selects step $1.
selected() { [ -z "$only" ] || [[ $1 =~ $only ]]; }
# A row for step $1 that cannot run here, for reason $2.
skip() { if selected "$1"; then row "$1" skipped "$2"; fi; }

# The first file matching the glob $1 under the site-packages of $python.
in_wheels() {
  "$python" - "$1" 2>/dev/null <<'PY'
import glob, os, site, sys
roots = site.getsitepackages() + [site.getusersitepackages()]
for root in roots:
    hits = sorted(glob.glob(os.path.join(root, "nvidia", "**", sys.argv[1]), recursive=True))
    hits += sorted(glob.glob(os.path.join(root, "triton", "**", sys.argv[1]), recursive=True))
    if hits:
        print(hits[0])
        break
PY
}
# The first library named $1* that the system loader knows or a CUDA install has.
in_system() {
  {
    ldconfig -p 2>/dev/null | awk -v name="$1" 'index($1, name) == 1 { print $NF }'
    for dir in ${CUDA_HOME:-} /usr/local/cuda; do ls "$dir/lib64/$1"* 2>/dev/null; done
  } | head -n 1
}
# Links $links/$1 to the first existing candidate and puts both folders on
# LD_LIBRARY_PATH; the target is left in $linked.
link() {
  local name=$1; shift
  for target in "$@"; do
    if [ -n "$target" ] && [ -e "$target" ]; then
      ln -sf "$target" "$links/$name"
      LD_LIBRARY_PATH="$links:$(dirname "$target")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      export LD_LIBRARY_PATH
      linked=$target
      return 0
    fi
  done
  return 1
}

gpu=$(nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
if [ -n "$gpu" ]; then row gpu ok "$gpu"; else row gpu FAIL "nvidia-smi found no GPU"; fi
# The GPU's architecture, for the NVRTC check (e.g. 90 for sm_90).
cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
[ -n "$cap" ] && export CUDA_COMPUTE_CAP=$cap

# cudarc asks the loader for libnvrtc.so (then .so.12, ...) and libnccl.so;
# wheels ship only versioned names, hence the links.
if link libnvrtc.so "$(in_system libnvrtc.so)" "$(in_wheels 'libnvrtc.so.[0-9]*')"; then
  row libnvrtc ok "$linked"
else
  row libnvrtc FAIL "not found: install a CUDA toolkit or pip install nvidia-cuda-nvrtc-cu12"
fi
have_nccl=0
if link libnccl.so "$(in_system libnccl.so)" "$(in_wheels 'libnccl.so.2')"; then
  row libnccl ok "$linked"
  have_nccl=1
else
  row libnccl missing "the NCCL steps need it (pip install nvidia-nccl-cu13)"
fi
ptxas=$(command -v ptxas || in_wheels ptxas)
[ -n "$ptxas" ] && export PTXAS=$ptxas

# Runs "$@" (if --only selects $name and the budget allows) with its output
# in $logs/$name.log; a row with the last line matching $pattern (else the
# last line), blanks squeezed.
step() {
  local name=$1 pattern=$2; shift 2
  selected "$name" || return 0
  local start=$SECONDS limit=$((deadline - SECONDS))
  if [ "$limit" -lt 30 ]; then
    row "$name" skipped "out of time (--budget $budget)"
    return 0
  fi
  [ "$limit" -gt 600 ] && limit=600
  echo "== $name: $*"
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  local detail
  detail=$(grep -E "$pattern" "$logs/$name.log" | tail -n 1)
  [ -n "$detail" ] || detail=$(grep -v '^[[:space:]]*$' "$logs/$name.log" | tail -n 1)
  [ -n "$detail" ] || detail="no output"
  detail="$(printf '%s\n' "$detail" | tr -s '[:blank:]' ' ' | sed 's/^ //' | cut -c1-100) ($((SECONDS - start)) s)"
  case $status in
    0) row "$name" ok "$detail" ;;
    124 | 137) row "$name" FAIL "timed out after $limit s: $detail" ;;
    *) row "$name" FAIL "exit $status: $detail" ;;
  esac
}
# The nccl-tests table row of the largest size.
largest='^ *[0-9]+ +[0-9]+ +float '

step nvrtc_compile 'test result|skipped' "$here/tests/nvrtc_compile" --nocapture
step cuda_parity 'test result' env REQUIRE_GPU=1 "$here/tests/cuda_parity"
# NCCL at world size 1, a peer that never joins, page-locked staging, and
# `--backend auto` with two ranks on one GPU (the trainer from this bundle).
if [ "$have_nccl" = 1 ]; then
  step nccl_gpu 'test result' env REQUIRE_GPU=1 REQUIRE_NCCL=1 TRAINER_BIN="$here/bin/trainer" \
    "$here/tests/nccl_gpu" --test-threads 1
else
  step nccl_gpu 'test result' env REQUIRE_GPU=1 TRAINER_BIN="$here/bin/trainer" \
    "$here/tests/nccl_gpu" --test-threads 1
fi

# Training: one GPU over no transport, over NCCL, two ranks sharing it over
# the TCP ring, and large batches.
trainer=("$here/bin/trainer" --device cuda --data-dir "$data_dir")
step train 'Epoch' "${trainer[@]}" --epochs "$epochs" --metrics "$logs/metrics.jsonl"
if [ "$have_nccl" = 1 ]; then
  step train_nccl 'Epoch' "${trainer[@]}" --backend nccl --epochs "$epochs" \
    --metrics "$logs/train_nccl.jsonl"
else
  skip train_nccl "no libnccl"
fi
step train_tcp_ws2 'Epoch' "${trainer[@]}" --world-size 2 --backend tcp --epochs "$epochs" \
  --metrics "$logs/train_tcp_ws2.jsonl"
step train_b512 'Epoch' "${trainer[@]}" --batch-size 512 --epochs 1 \
  --metrics "$logs/train_b512.jsonl"

# PyTorch on the same model and data, and its all-reduce.
if [ -n "$orig_ld" ]; then
  torch_env=(env PYTHONUNBUFFERED=1 LD_LIBRARY_PATH="$orig_ld")
else
  torch_env=(env -u LD_LIBRARY_PATH PYTHONUNBUFFERED=1)
fi
if "${torch_env[@]}" "$python" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  throughput=("${torch_env[@]}" "$python" "$here/pytorch/train_throughput.py" --device cuda
    --data-dir "$data_dir")
  step torch_ref_b64 'img/s' "${throughput[@]}" --mode reference --batch-size 64
  step torch_ref_b512 'img/s' "${throughput[@]}" --mode reference --batch-size 512
  step torch_gpu_b64 'img/s' "${throughput[@]}" --mode on-device --batch-size 64
  step torch_gpu_b512 'img/s' "${throughput[@]}" --mode on-device --batch-size 512
  step torch_allreduce "$largest" "${torch_env[@]}" "$python" "$here/pytorch/allreduce_nccl.py" \
    --min-bytes 8 --max-bytes 268435456
else
  for name in torch_ref_b64 torch_ref_b512 torch_gpu_b64 torch_gpu_b512 torch_allreduce; do
    if selected "$name"; then
      row torch skipped "no torch that sees a GPU in $python (set PYTHON=.../python)"
      break
    fi
  done
fi

# The benches (train_step is the CPU backend, one thread).
step bench_train_step '.' "$here/benches/train_step"
step bench_allreduce_unix "$largest" "$here/benches/allreduce" --ranks 2 --max-bytes 67108864
if [ "$have_nccl" = 1 ]; then
  step bench_allreduce_nccl "$largest" "$here/benches/allreduce" --transport nccl --ranks 1
else
  skip bench_allreduce_nccl "no libnccl"
fi

echo
echo "== summary ($(head -n 1 "$here/build-info.txt"); logs in $logs)"
printf '%-22s %-7s %s\n' step result detail
printf '%s\n' "${summary[@]}"
exit "$failed"
"#;

#[cfg(test)]
mod tests {
    use super::RUN_SH;
    use std::process::Command;

    /// `bash -n` accepts run.sh, and so does shellcheck where installed.
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
        match Command::new("shellcheck").arg(&script).output() {
            Ok(check) => assert!(
                check.status.success(),
                "shellcheck run.sh:\n{}",
                String::from_utf8_lossy(&check.stdout)
            ),
            Err(_) => eprintln!("shellcheck not installed; skipped"),
        }
    }
}
