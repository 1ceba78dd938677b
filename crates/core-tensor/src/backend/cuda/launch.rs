//! The launch layer: every `unsafe` of the CUDA backend, each block with the
//! reason it is sound. Kernel launches, the launch-parameter structs that
//! cross to the device by value, the raw memsets behind `fill`, the library
//! presence checks, and the NVRTC calls cudarc does not wrap (CUBIN output).

use std::any::Any;
use std::ffi::{CStr, CString, c_char};
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, DevicePtrMut, DeviceRepr, LaunchArgs, LaunchConfig,
    PushKernelArg,
};
use cudarc::nvrtc;

use super::Cuda;
use super::gemm::GemmLaunch;
use crate::ops::{AdamScalars, ClassGeom, Conv2dGeom, LinearGeom, PoolGeom};
use crate::{Elem, Error, Result};

/// Launch parameters of the dropout kernels; mirrored by `DropoutArgs` in
/// dropout.cu.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct DropoutArgs {
    pub n: u64,
    pub seed: u64,
    pub p: f32,
    pub scale: f32,
}

/// Launch parameters of the gather kernel; mirrored by `GatherArgs` in
/// gather.cu.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct GatherArgs {
    pub batch: u64,
    pub pixels: u64,
    pub samples: u64,
    pub first: u64,
}

// The kernels' parameter structs are passed by value: the driver copies
// `size_of` bytes from the pointer cudarc hands it. The C++ mirrors share the
// Rust layout because both are `repr(C)` with the same field types in the
// same order (`usize` = `unsigned long long` on the 64-bit hosts CUDA runs
// on, asserted below), and none holds a pointer or padding-dependent data.
const _: () = assert!(size_of::<usize>() == size_of::<u64>());
// SAFETY: repr(C), eight usize fields, mirrored by `Conv2dGeom` in conv2d.cu.
unsafe impl DeviceRepr for Conv2dGeom {}
// SAFETY: repr(C), four usize fields, mirrored by `PoolGeom` in maxpool2d.cu.
unsafe impl DeviceRepr for PoolGeom {}
// SAFETY: repr(C), three usize fields, mirrored by `LinearGeom` in linear.cu.
unsafe impl DeviceRepr for LinearGeom {}
// SAFETY: repr(C), two usize fields, mirrored by `ClassGeom` in
// cross_entropy.cu and accuracy.cu.
unsafe impl DeviceRepr for ClassGeom {}
// SAFETY: repr(C), seven f32 fields, mirrored by `AdamScalars` in adam.cu.
unsafe impl DeviceRepr for AdamScalars {}
// SAFETY: repr(C), two u64 then two f32 fields (no padding), mirrored by
// `DropoutArgs` in dropout.cu.
unsafe impl DeviceRepr for DropoutArgs {}
// SAFETY: repr(C), four u64 fields, mirrored by `GatherArgs` in gather.cu.
unsafe impl DeviceRepr for GatherArgs {}
// SAFETY: repr(C), a geometry (itself DeviceRepr, all 8-byte fields) then two
// u64; mirrored by `Conv2dLaunch` and `LinearLaunch` in the .cu files.
unsafe impl<G: DeviceRepr> DeviceRepr for GemmLaunch<G> {}

/// One kernel launch being assembled: arguments are pushed in the order of
/// the kernel's C signature, then [`KernelCall::launch`] queues it.
pub(crate) struct KernelCall<'a> {
    name: &'static str,
    args: LaunchArgs<'a>,
}

impl Cuda {
    /// Starts a launch of kernel `name` on this backend's stream.
    pub(crate) fn kernel(&self, name: &'static str) -> Result<KernelCall<'_>> {
        let function = self.function(name)?;
        Ok(KernelCall {
            name,
            args: self.stream().launch_builder(function),
        })
    }
}

impl<'a> KernelCall<'a> {
    pub(crate) fn arg<A>(&mut self, arg: A) -> &mut Self
    where
        LaunchArgs<'a>: PushKernelArg<A>,
    {
        self.args.arg(arg);
        self
    }

    /// Queues the kernel; a bad configuration or argument list is reported
    /// here, a fault while it runs at the next synchronization.
    pub(crate) fn launch(&mut self, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: the callers are the op modules (`src/ops/<op>/cuda.rs`)
        // and the GEMM launcher they share (`gemm.rs`), and each upholds the contract that makes a launch sound:
        // * the arguments are pushed in the order and with the types of the
        //   kernel's C signature in the op's .cu file (buffers as device
        //   slices or views of the element type the kernel reads, parameter
        //   structs through the DeviceRepr impls above);
        // * every buffer length was checked against the geometry first, with
        //   the same `check` the CPU kernel runs, and the kernels index only
        //   within the lengths that geometry implies (every thread bounds-
        //   checks its index against the element count it is given);
        // * outputs are pushed as `&mut` slices or views, so Rust's borrow
        //   rules keep them from aliasing the inputs; the fault word is
        //   borrowed mutably through its mutex.
        // All work is ordered on this backend's single stream, and cudarc
        // frees device memory in stream order, so no buffer is freed under a
        // running kernel.
        unsafe { self.args.launch(cfg) }.map_err(|source| Error::KernelLaunch {
            kernel: self.name,
            source,
        })?;
        Ok(())
    }
}

/// A launch of `threads`-thread blocks covering `n` elements, one per thread.
pub(crate) fn blocks_for(op: &'static str, n: usize, threads: u32) -> Result<LaunchConfig> {
    let blocks = n.div_ceil(threads as usize);
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|&b| b <= i32::MAX as u32)
        .ok_or_else(|| Error::InvalidArgument {
            op,
            reason: format!("{n} elements exceed one launch"),
        })?;
    Ok(LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
}

/// Sets every element of `dst` to `value` with the driver's memsets.
pub(crate) fn fill<T: Elem>(
    stream: &Arc<CudaStream>,
    dst: &mut CudaSlice<T>,
    value: T,
) -> Result<()> {
    // `Elem` is sealed to f32, u32 and u8: 4-byte values become a 32-bit
    // pattern, bytes a byte pattern.
    let value: &dyn Any = &value;
    let pattern = if let Some(v) = value.downcast_ref::<f32>() {
        Pattern::Word(v.to_bits())
    } else if let Some(v) = value.downcast_ref::<u32>() {
        Pattern::Word(*v)
    } else if let Some(v) = value.downcast_ref::<u8>() {
        Pattern::Byte(*v)
    } else {
        return Err(Error::InvalidArgument {
            op: "fill",
            reason: "unsupported element type".into(),
        });
    };
    stream.context().bind_to_thread()?;
    let len = dst.len();
    let cu_stream = stream.cu_stream();
    let (ptr, _written) = dst.device_ptr_mut(stream);
    match pattern {
        // SAFETY: `ptr` addresses `len` 4-byte elements owned by `dst`, which
        // is borrowed mutably for the call; the memset is queued on the stream
        // that orders all work on `dst` (`_written` records it for cudarc).
        Pattern::Word(bits) => unsafe {
            cudarc::driver::sys::cuMemsetD32Async(ptr, bits, len, cu_stream).result()?
        },
        // SAFETY: as above, with `len` 1-byte elements.
        Pattern::Byte(byte) => unsafe {
            cudarc::driver::result::memset_d8_async(ptr, byte, len, cu_stream)?
        },
    }
    Ok(())
}

enum Pattern {
    Word(u32),
    Byte(u8),
}

/// Turns off cudarc's per-buffer event tracking on `ctx`; called before
/// anything is allocated on it. Tracking would record and wait on events
/// around every kernel argument once a second stream exists, a few
/// microseconds per launch for nothing: this backend orders its own work by
/// queuing it all on one stream.
pub(crate) fn untracked_streams(ctx: &CudaContext) {
    // SAFETY: cudarc's obligations when tracking is off are about buffers
    // used on more than one stream. The backend uses one stream; the only
    // other is `Cuda::side_stream`, whose users order it against the
    // backend's stream with events (the trainer's NCCL averager: the side
    // stream waits for backward before each collective, the compute stream
    // waits for the collectives before anything reads the gradients, and
    // the gradient buffer outlives both).
    unsafe { ctx.disable_event_tracking() }
}

/// Page-locks `data` for every context (`CU_MEMHOSTREGISTER_PORTABLE`);
/// `false` when the driver refuses (the buffer stays usable, pageable).
/// The calling thread must have a current context.
pub(crate) fn lock_pages(data: &mut [f32]) -> bool {
    // SAFETY: the range is a live allocation of `size_of_val(data)` bytes;
    // the caller (`PinnedVec`) never reallocates it while locked and
    // unlocks it before freeing it.
    let result = unsafe {
        cudarc::driver::sys::cuMemHostRegister_v2(
            data.as_mut_ptr().cast(),
            size_of_val(data),
            cudarc::driver::sys::CU_MEMHOSTREGISTER_PORTABLE,
        )
    };
    result == cudarc::driver::sys::CUresult::CUDA_SUCCESS
}

/// Undoes [`lock_pages`] for the same range.
pub(crate) fn unlock_pages(data: &mut [f32]) {
    // SAFETY: `data` starts where a successful `lock_pages` call locked it;
    // no copy into or out of it is queued (every copy through it is
    // synchronous, see `read_range` and `write_range`). The result is
    // ignored: the memory is freed right after either way.
    let _ = unsafe { cudarc::driver::sys::cuMemHostUnregister(data.as_mut_ptr().cast()) };
}

/// An error naming `libcuda.so` unless the NVIDIA driver library loads.
/// cudarc panics when it first needs a missing library, so every entry
/// point checks here first.
pub(crate) fn require_driver() -> Result<()> {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: only dlopen's the driver library by name and closes it again;
    // its initializers are the NVIDIA driver's own.
    if *PRESENT.get_or_init(|| unsafe { cudarc::driver::sys::is_culib_present() }) {
        Ok(())
    } else {
        Err(Error::CudaLibraryMissing {
            library: "libcuda.so (the CUDA driver API)",
            provider: "the NVIDIA driver",
            hint: "install the driver, or add the folder holding libcuda.so.1 to LD_LIBRARY_PATH",
        })
    }
}

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
pub(crate) fn nvrtc_version() -> Result<(i32, i32)> {
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
pub(crate) fn nvrtc_compile(
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
