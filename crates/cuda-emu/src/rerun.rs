//! Running a test binary's GPU tests on the emulator. The loader reads
//! `LD_LIBRARY_PATH` only when a process starts, so a test that wants the
//! emulator builds it and runs its own binary again with the emulator's
//! folder first on that path; the tests named there then find "a GPU".

use std::env;
use std::path::{Path, PathBuf};

use core_tensor::backend::cuda::KERNEL_CACHE_VAR;
use std::process::Command;

use crate::{Emulator, nvrtc_lib_dir};

/// Set in the re-run, where the emulator is loaded.
const IN_EMULATOR: &str = "CUDA_EMU_RERUN";

/// Whether this process is a re-run on the emulator.
pub fn in_emulator() -> bool {
    env::var_os(IN_EMULATOR).is_some()
}

/// Runs this test binary again on the emulator (built in
/// `<target_tmp>/cuda-emu`) with `args` (test names, `--skip`, ...) and
/// `vars`, prints what it said, and fails unless it passed at least
/// `min_passed` tests. Returns at once inside the re-run, and skips where
/// a GPU is present (the tests ran on it) or where the emulator cannot be
/// built or NVRTC is missing; REQUIRE_CUDA_EMU=1 turns those skips into
/// failures.
pub fn rerun_on_emulator(
    target_tmp: &Path,
    args: &[&str],
    vars: &[(&str, &str)],
    min_passed: usize,
) {
    if in_emulator() {
        return;
    }
    if core_tensor::cuda_available().is_ok_and(|n| n > 0) {
        println!("skipped: a GPU is present, and the tests ran on it");
        return;
    }
    let emulator = match Emulator::build(&target_tmp.join("cuda-emu")) {
        Ok(emulator) => emulator,
        Err(e) => return skip(&e.to_string()),
    };
    if nvrtc_lib_dir().is_none() && core_tensor::backend::cuda::nvrtc_version().is_err() {
        return skip(
            "NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set NVRTC_LIB_DIR): the \
             CUDA backend compiles its kernels with it",
        );
    }
    let out = Command::new(env::current_exe().expect("the test binary's path"))
        .args(args)
        .env("LD_LIBRARY_PATH", emulator.library_path())
        .env(IN_EMULATOR, "1")
        // NVRTC's compiles are the emulated tests' slowest part: every
        // re-run of the build tree shares one kernel cache (unless `vars`
        // names another), which the first to need a module fills.
        .env(KERNEL_CACHE_VAR, shared_kernel_cache(target_tmp))
        .envs(vars.iter().copied())
        .output()
        .expect("re-running the test binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the tests failed on the emulator");
    let passed: usize = stdout
        .split("test result: ok. ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        passed >= min_passed,
        "{passed} tests ran on the emulator, expected {min_passed}"
    );
}

/// The kernel cache the re-runs share, in the build tree's `target_tmp`.
pub fn shared_kernel_cache(target_tmp: &Path) -> PathBuf {
    target_tmp.join("kernel-cache")
}

fn skip(why: &str) {
    assert!(
        env::var("REQUIRE_CUDA_EMU").map_or(true, |v| v != "1"),
        "REQUIRE_CUDA_EMU=1, but: {why}"
    );
    println!("skipped: {why}");
}
