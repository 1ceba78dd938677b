//! `cargo xtask device-bundle`: everything a GPU machine without a Rust
//! toolchain needs to check the CUDA backend, in one folder to copy there.
//!
//! ```text
//! device-bundle/
//!   run.sh                 finds the CUDA libraries, runs every check, prints a summary
//!   bin/trainer            release build
//!   tests/<name>           core-tensor's GPU test executables (release)
//!   benches/<name>         the bench executables (release)
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
    copy_all(
        &artifacts(&["bench", "--no-run", "-p", "benches"])?,
        "benches",
        &args.out,
    )?;
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
fn artifacts(args: &[&str]) -> Result<Vec<Artifact>> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("cargo {}", args.join(" "));
    let out = Command::new(cargo)
        .args(args)
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
# see docs/gpu.md). Usage: ./run.sh [--data-dir DIR] [--epochs N]
#
# Needs the NVIDIA driver, and NVRTC from a CUDA toolkit or a pip wheel (a
# PyTorch venv has one: run with that python on PATH or PYTHON=.../python).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
data_dir="$here/data/fashion-mnist"
epochs=5
while [ $# -gt 0 ]; do
  case "$1" in
    --data-dir) data_dir=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    *) echo "usage: $0 [--data-dir DIR] [--epochs N]" >&2; exit 2 ;;
  esac
done
logs="$here/logs"
links="$here/lib"
mkdir -p "$logs" "$links"
python=${PYTHON:-python3}
summary=()
failed=0
row() { summary+=("$(printf '%-16s %-7s %s' "$1" "$2" "$3")"); [ "$2" = FAIL ] && failed=1; }

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
if link libnccl.so "$(in_system libnccl.so)" "$(in_wheels 'libnccl.so.2')"; then
  row libnccl ok "$linked"
else
  row libnccl missing "only multi-GPU runs need it (pip install nvidia-nccl-cu13)"
fi
ptxas=$(command -v ptxas || in_wheels ptxas)
[ -n "$ptxas" ] && export PTXAS=$ptxas

# Runs "$@" with its output in $logs/$name.log; a row with the last line
# matching $pattern (else the last line).
step() {
  local name=$1 pattern=$2; shift 2
  local start=$SECONDS
  echo "== $name: $*"
  "$@" 2>&1 | tee "$logs/$name.log"
  local status=${PIPESTATUS[0]}
  local detail
  detail=$(grep -E "$pattern" "$logs/$name.log" | tail -n 1)
  [ -n "$detail" ] || detail=$(grep -v '^[[:space:]]*$' "$logs/$name.log" | tail -n 1)
  detail="$(echo "$detail" | cut -c1-100) ($((SECONDS - start)) s)"
  if [ "$status" -eq 0 ]; then row "$name" ok "$detail"; else row "$name" FAIL "exit $status: $detail"; fi
}

step nvrtc_compile 'test result|skipped' "$here/tests/nvrtc_compile" --nocapture
step cuda_parity 'test result' env REQUIRE_GPU=1 "$here/tests/cuda_parity"
step train 'Epoch' "$here/bin/trainer" --device cuda --epochs "$epochs" \
  --data-dir "$data_dir" --metrics "$logs/metrics.jsonl"
for bench in "$here"/benches/*; do
  [ -x "$bench" ] && step "bench_$(basename "$bench")" '.' timeout 600 "$bench"
done

echo
echo "== summary ($(head -n 1 "$here/build-info.txt"); logs in $logs)"
printf '%-16s %-7s %s\n' step result detail
printf '%s\n' "${summary[@]}"
exit "$failed"
"#;
