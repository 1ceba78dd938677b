//! The bundle's `kernels/`: every kernel module compiled and checked here,
//! so that the GPU machine only loads them (`nvrtc_compile` took 32 s of
//! the 2026-11-27 call, and every trainer there compiled again without a
//! cache).
//!
//! - `ptxas.txt`: core-tensor's `nvrtc_compile` test, run here with
//!   `REQUIRE_NVRTC=1`: every module compiled for sm_90, ptxas's registers,
//!   shared memory and spills per kernel (a spill fails it, and the bundle).
//! - `<module>-<hash>.cubin`: the kernel cache (`CORE_TENSOR_KERNEL_CACHE`)
//!   filled by starting the CUDA backend on cuda-emu (which reports sm_90)
//!   once per NVRTC given, since an entry is keyed by NVRTC's version: the
//!   trainer there reads the set of the NVRTC it loads.
//! - `nvrtc.txt`: which NVRTC versions the set was compiled with.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Fills `out/kernels` from the `nvrtc_compile` test executable and the
/// bundled `cnn_layers` bench, once per NVRTC library folder of
/// `nvrtc_dirs`, else with the cu12 wheel's (or `$NVRTC_LIB_DIR`): a set
/// is about 6.5 MB, and the bundle must stay under 60 MiB.
pub(super) fn bundle(out: &Path, nvrtc_test: &Path, nvrtc_dirs: &[PathBuf]) -> Result<()> {
    let dir = out.join("kernels");
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "compiling and checking every kernel for sm_90 ({})",
        nvrtc_test.display()
    );
    let check = Command::new(nvrtc_test)
        .arg("--nocapture")
        .env("REQUIRE_NVRTC", "1")
        .output()
        .with_context(|| format!("running {}", nvrtc_test.display()))?;
    let table = [check.stdout, check.stderr].concat();
    std::fs::write(dir.join("ptxas.txt"), &table)?;
    if !check.status.success() {
        bail!(
            "nvrtc_compile failed (a kernel does not compile for sm_90, or spills): see {}; \
             it needs the wheels nvidia-cuda-nvrtc-cu12 and nvidia-cuda-nvcc-cu12",
            dir.join("ptxas.txt").display()
        );
    }
    let nvrtc_all: Vec<PathBuf> = if nvrtc_dirs.is_empty() {
        cuda_emu::nvrtc_lib_dir().into_iter().collect()
    } else {
        nvrtc_dirs.to_vec()
    };
    if nvrtc_all.is_empty() {
        bail!(
            "no NVRTC to compile the kernel cache with: pip install nvidia-cuda-nvrtc-cu12, \
             or pass --nvrtc DIR"
        );
    }
    let emulator = cuda_emu::Emulator::build(&super::target_dir().join("cuda-emu"))
        .context("building cuda-emu, which starts the CUDA backend here to fill the cache")?;
    let mut versions = Vec::new();
    for (i, nvrtc) in nvrtc_all.iter().enumerate() {
        let links = super::target_dir().join(format!("device-bundle-nvrtc/{i}"));
        let origin = fill_cache(
            &dir,
            &emulator,
            nvrtc,
            &links,
            &out.join("benches/cnn_layers"),
        )
        .with_context(|| format!("--nvrtc {}", nvrtc.display()))?;
        versions.push(origin);
    }
    std::fs::write(dir.join("nvrtc.txt"), versions.join(", "))?;
    Ok(())
}

/// Starts the CUDA backend on the emulator with the NVRTC of `nvrtc` (a
/// folder holding `libnvrtc.so.N`, linked as `links/libnvrtc.so`, the name
/// cudarc asks for) and the kernel cache at `cache`; returns the `NVRTC X.Y
/// for sm_NN` it reported.
fn fill_cache(
    cache: &Path,
    emulator: &cuda_emu::Emulator,
    nvrtc: &Path,
    links: &Path,
    cnn_layers: &Path,
) -> Result<String> {
    let lib = std::fs::read_dir(nvrtc)
        .with_context(|| format!("reading {}", nvrtc.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_prefix("libnvrtc.so."))
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit()))
        })
        .with_context(|| format!("no libnvrtc.so.N in {}", nvrtc.display()))?;
    let _ = std::fs::remove_dir_all(links);
    std::fs::create_dir_all(links)?;
    std::os::unix::fs::symlink(&lib, links.join("libnvrtc.so"))?;
    let path = std::env::join_paths([emulator.dir(), links, nvrtc])?;
    let run = Command::new(cnn_layers)
        .args(["--device", "cuda", "--only", "none", "--reps", "1"])
        .env("LD_LIBRARY_PATH", path)
        .env("CUDA_EMU_DEVICES", "1")
        .env("CORE_TENSOR_KERNEL_CACHE", cache)
        .output()
        .with_context(|| format!("running {}", cnn_layers.display()))?;
    let stdout = String::from_utf8_lossy(&run.stdout);
    if !run.status.success() {
        bail!(
            "the CUDA backend did not start on cuda-emu: {}{}",
            stdout.trim(),
            String::from_utf8_lossy(&run.stderr).trim()
        );
    }
    let origin = stdout
        .split("kernels from ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .with_context(|| format!("no `kernels from NVRTC ...` in: {}", stdout.trim()))?;
    eprintln!("kernel cache: {origin} ({})", lib.display());
    Ok(origin.to_owned())
}
