//! Finding NVIDIA's pip wheels, which is where a machine without the CUDA
//! toolkit gets NVRTC and ptxas (`nvidia-cuda-nvrtc-cu12`,
//! `nvidia-cuda-nvcc-cu12`). The emulated backend compiles its kernels with
//! the real NVRTC, so a process running on the emulator needs it too.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// `$NVRTC_LIB_DIR`, else the lib folder of the `nvidia-cuda-nvrtc-cu12`
/// wheel of `$PYTHON` (default python3).
pub fn nvrtc_lib_dir() -> Option<PathBuf> {
    env::var_os("NVRTC_LIB_DIR")
        .map(PathBuf::from)
        .or_else(|| wheel_dir("cuda_nvrtc").map(|d| d.join("lib")))
        .filter(|d| d.is_dir())
}

/// The folder of the `nvidia.<package>` namespace package of `$PYTHON`
/// (default python3), e.g. `cuda_nvcc` for the wheel that has ptxas.
pub fn wheel_dir(package: &str) -> Option<PathBuf> {
    let python = env::var_os("PYTHON").unwrap_or_else(|| "python3".into());
    let script = format!("import nvidia.{package} as m; print(list(m.__path__)[0])");
    let out = Command::new(python).args(["-c", &script]).output().ok()?;
    out.status
        .success()
        .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
