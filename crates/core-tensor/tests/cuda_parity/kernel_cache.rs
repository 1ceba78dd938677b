//! The kernel cache across processes, on `cuda-emu`: a first process
//! compiles every module with NVRTC and saves it, a second reads them all
//! back, a damaged entry is compiled again (and the GPU still opens), and
//! an entry the driver refuses is an error that names the cache.

use std::path::Path;

use core_tensor::backend::cuda::KERNEL_CACHE_VAR;
use core_tensor::{Backend, Cuda};
use sha2::{Digest, Sha256};

/// What the re-run's GPU must say of where its kernels came from.
const WANT: &str = "KERNEL_CACHE_WANT";

#[test]
fn the_kernel_cache_across_processes_on_the_cuda_emulator() {
    if cuda_emu::in_emulator() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("kernels");
    let open_gpu = |want: &str| {
        cuda_emu::rerun_on_emulator(
            Path::new(env!("CARGO_TARGET_TMPDIR")),
            &[
                "--exact",
                "kernel_cache::emulated_kernels_come_continues_from_expected",
            ],
            &[(KERNEL_CACHE_VAR, cache.to_str().unwrap()), (WANT, want)],
            1,
        )
    };
    open_gpu(", saved in the kernel cache");
    open_gpu(", read from the kernel cache");
    let entries: Vec<_> = std::fs::read_dir(&cache)
        .map(|d| d.map(|e| e.unwrap().path()).collect())
        .unwrap_or_default();
    // Empty where the emulator was skipped (no g++ or NVRTC, or a GPU).
    if let Some(entry) = entries.first() {
        let bytes = std::fs::read(entry).unwrap();
        std::fs::write(entry, &bytes[..bytes.len() / 2]).unwrap();
        open_gpu(&format!(
            ", 1 compiled and {} read from the kernel cache",
            entries.len() - 1
        ));
        // Intact by its checksum, but no CUBIN: the driver's refusal names
        // the cache and the way out.
        let mut forged = b"not a cubin\0".to_vec();
        forged.extend_from_slice(&Sha256::digest(&forged));
        std::fs::write(entry, forged).unwrap();
        open_gpu("`: the driver refused its CUBIN from the kernel cache");
    }
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
