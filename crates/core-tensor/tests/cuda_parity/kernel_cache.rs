//! The kernel cache across processes, on `cuda-emu`: a first process
//! compiles every module with NVRTC and saves it, a second reads them all
//! back, and a damaged entry is compiled again (and the GPU still opens).

use std::path::Path;

use core_tensor::backend::cuda::KERNEL_CACHE_VAR;
use core_tensor::{Backend, Cuda};

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
                "kernel_cache::emulated_kernels_come_from_where_expected",
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
    }
}

/// Inside the re-runs above only: opens the emulated GPU and checks where
/// its kernels came from.
#[test]
fn emulated_kernels_come_from_where_expected() {
    let Some(want) = std::env::var_os(WANT) else {
        return;
    };
    let gpu = Cuda::new(0).expect("the emulator is loaded");
    let from = gpu.describe();
    if from.contains("from nvcc") {
        println!("SKIPPED: the kernels came from nvcc's PTX, not NVRTC: {from}");
        return;
    }
    assert!(from.contains(want.to_str().unwrap()), "{from}");
}
