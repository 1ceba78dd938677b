//! The kernel cache across processes, on `cuda-emu`: a first process
//! compiles every module with NVRTC and saves it; a process that finds one
//! entry missing
//! compiles and saves that one and reads the others, the next reads them
//! all, a damaged entry is compiled again (and the GPU still opens), and
//! an entry the driver refuses is an error that names the cache.

use std::path::{Path, PathBuf};

use core_tensor::backend::cuda::KERNEL_CACHE_VAR;
use core_tensor::{Backend, Cuda};
use sha2::{Digest, Sha256};

/// What the re-run's GPU must say of where its kernels came from.
const WANT: &str = "KERNEL_CACHE_WANT";

/// Opens the emulated GPU in a re-run with its kernels cached in `cache`,
/// checking that it says `want` of them.
fn open_gpu(cache: &Path, want: &str) {
    cuda_emu::rerun_on_emulator(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &[
            "--exact",
            "kernel_cache::emulated_kernels_come_continues_from_expected",
        ],
        &[(KERNEL_CACHE_VAR, cache.to_str().unwrap()), (WANT, want)],
        1,
    );
}

#[test]
fn the_kernel_cache_across_processes_on_the_cuda_emulator() {
    if cuda_emu::in_emulator() {
        return;
    }
    // A cache of its own, not the one the build tree's emulated runs share
    // (`cuda_emu::shared_kernel_cache`): other test binaries fill and read
    // that one at the same time, so neither its counts nor emptying it
    // would be this test's to rely on.
    let first = tempfile::tempdir().unwrap();
    open_gpu(first.path(), ", saved in the kernel cache");
    // The CUBINs, not the lock files beside them (held while a module
    // compiles, so that processes started together compile it once).
    let mut entries: Vec<PathBuf> = std::fs::read_dir(first.path())
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    entries.retain(|e| e.extension().is_some_and(|x| x == "cubin"));
    // Empty where the emulator was skipped (no g++ or NVRTC, or a GPU).
    if entries.is_empty() {
        return;
    }
    // A copy of that cache, less its smallest entry (the quickest
    // module to compile again).
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kernels");
    std::fs::create_dir(&cache).unwrap();
    entries.sort_by_key(|e| std::fs::metadata(e).unwrap().len());
    for entry in &entries[1..] {
        std::fs::copy(entry, cache.join(entry.file_name().unwrap())).unwrap();
    }
    let entry = cache.join(entries[0].file_name().unwrap());
    let others = entries.len() - 1;
    let one_compiled = format!(", 1 compiled and {others} read from the kernel cache");
    open_gpu(&cache, &one_compiled);
    assert_eq!(
        std::fs::read(&entry).unwrap(),
        std::fs::read(&entries[0]).unwrap(),
        "the module compiled again is saved, as it was"
    );
    open_gpu(&cache, ", read from the kernel cache");
    let bytes = std::fs::read(&entry).unwrap();
    std::fs::write(&entry, &bytes[..bytes.len() / 2]).unwrap();
    open_gpu(&cache, &one_compiled);
    // Intact by its checksum, but no CUBIN: the driver's refusal names the
    // cache and the way out.
    let mut forged = b"not a cubin\0".to_vec();
    forged.extend_from_slice(&Sha256::digest(&forged));
    std::fs::write(&entry, forged).unwrap();
    open_gpu(
        &cache,
        "`: the driver refused its CUBIN from the kernel cache",
    );
}

/// Inside the re-runs above only: opens the emulated GPU and checks where
/// its kernels came from (or the error opening it).
#[test]
fn emulated_kernels_come_continues_from_expected() {
    let Some(want) = std::env::var_os(WANT) else {
        return;
    };
    let from = match Cuda::new(0) {
        Ok(gpu) => gpu.describe(),
        Err(e) => format!("error: {e}"),
    };
    if from.contains("from nvcc") {
        println!("SKIPPED: the kernels came from nvcc's PTX, not NVRTC: {from}");
        return;
    }
    assert!(from.contains(want.to_str().unwrap()), "{from}");
}
