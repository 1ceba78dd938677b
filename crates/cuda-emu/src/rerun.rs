//! Running a test binary's GPU tests on the emulator. The loader reads
//! `LD_LIBRARY_PATH` only when a process starts, so a test that wants the
//! emulator builds it and runs its own binary again with the emulator's
//! folder first on that path; the tests named there then find "a GPU".

use std::path::{Path, PathBuf};
use std::{env, thread};

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
    if let Some(emulator) = emulator_for_rerun(target_tmp) {
        let passed = rerun(&emulator, target_tmp, args, vars);
        check_passed(passed, min_passed);
    }
}

/// [`rerun_on_emulator`] for the tests `args` select, shared out over one
/// re-run per core, side by side. The emulator runs one kernel at a time in
/// a process (its blocks' fibers and shared memory are the process's), so
/// one re-run of many kernel-bound tests keeps one core busy however many
/// test threads it has; processes of their own do not wait for each other.
/// For tests that do not share a process's state (each opens its own GPU).
pub fn rerun_side_by_side_on_emulator(
    target_tmp: &Path,
    args: &[&str],
    vars: &[(&str, &str)],
    min_passed: usize,
) {
    let Some(emulator) = emulator_for_rerun(target_tmp) else {
        return;
    };
    let tests = listed_tests(args);
    let shares = thread::available_parallelism()
        .map_or(1, usize::from)
        .min(tests.len());
    if shares < 2 {
        let passed = rerun(&emulator, target_tmp, args, vars);
        return check_passed(passed, min_passed);
    }
    // Round robin in name order, so that one file's heavy tests, which
    // sort together, fall into different shares.
    let mut groups = vec![vec!["--exact"]; shares];
    for (i, test) in tests.iter().enumerate() {
        groups[i % shares].push(test.as_str());
    }
    let passed: usize = thread::scope(|scope| {
        let runs: Vec<_> = groups
            .iter()
            .map(|group| scope.spawn(|| rerun(&emulator, target_tmp, group, vars)))
            .collect();
        runs.into_iter()
            .map(|run| run.join().expect("a re-run's thread panicked"))
            .sum()
    });
    check_passed(passed, min_passed);
}

/// The emulator for a re-run from this process, or `None` where there is
/// to be none: inside the re-run, beside a GPU, or where it cannot be had
/// (a failure under REQUIRE_CUDA_EMU=1).
fn emulator_for_rerun(target_tmp: &Path) -> Option<Emulator> {
    if in_emulator() {
        return None;
    }
    if core_tensor::cuda_available().is_ok_and(|n| n > 0) {
        println!("skipped: a GPU is present, and the tests ran on it");
        return None;
    }
    let emulator = match Emulator::build(&target_tmp.join("cuda-emu")) {
        Ok(emulator) => emulator,
        Err(e) => {
            skip(&e.to_string());
            return None;
        }
    };
    if nvrtc_lib_dir().is_none() && core_tensor::backend::cuda::nvrtc_version().is_err() {
        skip(
            "NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set NVRTC_LIB_DIR): the \
             CUDA backend compiles its kernels with it",
        );
        return None;
    }
    Some(emulator)
}

/// The names of the tests `args` select in this binary (libtest's terse
/// list: `name: test` a line).
fn listed_tests(args: &[&str]) -> Vec<String> {
    let out = Command::new(env::current_exe().expect("the test binary's path"))
        .args(args)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("listing the test binary's tests");
    assert!(out.status.success(), "listing the tests failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// One re-run of this binary on `emulator` with `args` and `vars`: prints
/// what it said, fails unless it passed; how many tests passed.
fn rerun(emulator: &Emulator, target_tmp: &Path, args: &[&str], vars: &[(&str, &str)]) -> usize {
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
    stdout
        .split("test result: ok. ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn check_passed(passed: usize, min_passed: usize) {
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
