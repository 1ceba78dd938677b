//! NVRTC, the runtime compiler: its presence check, its version, and the
//! calls cudarc does not wrap (CUBIN output), each `unsafe` block with the
//! reason it is sound.

use std::ffi::{CStr, CString, c_char};
use std::sync::OnceLock;

use cudarc::nvrtc;

use crate::{Error, Result};

/// An error naming `libnvrtc.so` unless NVRTC loads.
pub(crate) fn require_nvrtc() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only dlopen's NVRTC by name and closes it again.
    if *PRESENT.get_or_init(|| unsafe { nvrtc::sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(Error::CudaLibraryMissing {
            library: "libnvrtc.so (NVRTC, the CUDA runtime compiler)",
            provider: "the CUDA toolkit or the `nvidia-cuda-nvrtc-cu12` pip wheel",
            hint: "add its lib folder (e.g. .../site-packages/nvidia/cuda_nvrtc/lib) to \
                   LD_LIBRARY_PATH",
        })
    }
}

/// The loaded NVRTC's `(major, minor)` version.
pub(crate) fn version() -> Result<(i32, i32)> {
    require_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded (checked above); the two pointers are valid
    // for writes for the duration of the call.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result()?;
    Ok((major, minor))
}

/// What NVRTC hands back.
#[derive(Clone, Copy)]
pub(crate) enum Output {
    /// PTX text, for `--gpu-architecture=compute_XY`.
    Ptx,
    /// A CUBIN, for `--gpu-architecture=sm_XY`.
    Cubin,
}

/// An NVRTC program, destroyed on drop.
struct Program(nvrtc::sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `create_program` and is destroyed only
        // here, once. A failure to free cannot be reported from drop; the
        // program's memory is then leaked, which is harmless.
        let _ = unsafe { nvrtc::result::destroy_program(self.0) };
    }
}

/// Compiles `source` (module `module`) with `options`.
pub(crate) fn compile(
    module: &'static str,
    source: &str,
    options: &[String],
    output: Output,
) -> Result<Vec<u8>> {
    require_nvrtc()?;
    let build_error = |reason: String| Error::KernelBuild { module, reason };
    let src = CString::new(source).map_err(|e| build_error(e.to_string()))?;
    let name = CString::new(format!("{module}.cu")).map_err(|e| build_error(e.to_string()))?;
    let program = Program(nvrtc::result::create_program(&src, Some(&name))?);
    // SAFETY: `program.0` is a live program (destroyed only by `Program`'s
    // drop, after this function); `src` and `name`, which it may reference,
    // outlive it.
    if let Err(e) = unsafe { nvrtc::result::compile_program(program.0, options) } {
        // SAFETY: as above; the log exists once compilation has run.
        let log = unsafe { nvrtc::result::get_program_log(program.0) }
            .map(|log| c_chars_to_string(&log))
            .unwrap_or_default();
        return Err(build_error(format!(
            "NVRTC {e} with options {options:?}:\n{log}"
        )));
    }
    match output {
        Output::Ptx => {
            // SAFETY: as above, after a successful compilation.
            let ptx = unsafe { nvrtc::result::get_ptx(program.0) }?;
            Ok(c_chars_to_string(&ptx).into_bytes())
        }
        Output::Cubin => {
            let mut size = 0usize;
            // SAFETY: as above; `size` is valid for writes.
            unsafe { nvrtc::sys::nvrtcGetCUBINSize(program.0, &mut size) }.result()?;
            let mut cubin = vec![0u8; size];
            // SAFETY: as above; `cubin` holds the `size` bytes NVRTC writes.
            unsafe { nvrtc::sys::nvrtcGetCUBIN(program.0, cubin.as_mut_ptr().cast::<c_char>()) }
                .result()?;
            Ok(cubin)
        }
    }
}

/// NVRTC's NUL-terminated text as a `String`.
fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}
