//! The launch layer: the CUDA backend's `unsafe` blocks, each with the
//! reason it is sound. The one kernel launch (inside `kernel_table!`, which
//! turns an op's kernel table into typed `unsafe fn` launchers), the GEMMs'
//! launch-parameter struct that crosses to the device by value (each op's
//! own structs have their `DeviceRepr` beside its table), the raw memsets
//! behind `fill`, page locking and the driver's presence check. (The NVRTC
//! calls are in `nvrtc.rs`.)

use std::any::Any;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{
    CudaContext, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtrMut, DeviceRepr,
    LaunchArgs, LaunchConfig, PushKernelArg,
};

use super::Cuda;
use crate::{Elem, Error, Result};

/// The parameter struct of every GEMM kernel: the op's geometry plus the
/// tiling. Mirrored by `Conv2dLaunch` and `LinearLaunch` in the .cu files.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct GemmLaunch<G> {
    pub geom: G,
    pub tiling: GemmTiling,
}

/// How one product is cut into blocks (`GemmPlan::args`, gemm.rs);
/// mirrored by `GemmTiling` in sgemm.cuh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct GemmTiling {
    pub k_chunk: u64,
    pub splits: u64,
    pub tile_m: u64,
    pub tile_n: u64,
}

// The kernels' parameter structs are passed by value: the driver copies
// `size_of` bytes from the pointer cudarc hands it. The C++ mirrors share the
// Rust layout because both are `repr(C)` with the same field types in the
// same order (`usize` = `unsigned long long` on the 64-bit hosts CUDA runs
// on, asserted below), and none holds a pointer or padding-dependent data.
// Each op's structs have their `DeviceRepr` impl beside them, in its
// `cuda.rs`, on the same grounds.
const _: () = assert!(size_of::<usize>() == size_of::<u64>());
// SAFETY: repr(C), a geometry (itself DeviceRepr, all 8-byte fields) then
// `GemmTiling`'s four u64; mirrored by `Conv2dLaunch` and `LinearLaunch` in the .cu files.
unsafe impl<G: DeviceRepr> DeviceRepr for GemmLaunch<G> {}

/// A device buffer a kernel reads: pushed as a `const T*` argument.
pub(crate) trait DeviceIn<T> {
    fn push<'b>(&'b self, call: &mut KernelCall<'b>);
}

/// A device buffer a kernel writes: pushed as a `T*` argument. Taken as
/// `&mut`, so Rust's borrow rules keep it from aliasing the inputs.
pub(crate) trait DeviceOut<T> {
    fn push<'b>(&'b mut self, call: &mut KernelCall<'b>);
}

impl<T> DeviceIn<T> for CudaSlice<T> {
    fn push<'b>(&'b self, call: &mut KernelCall<'b>) {
        call.args.arg(self);
    }
}

impl<T> DeviceIn<T> for CudaView<'_, T> {
    fn push<'b>(&'b self, call: &mut KernelCall<'b>) {
        call.args.arg(self);
    }
}

impl<T> DeviceOut<T> for CudaSlice<T> {
    fn push<'b>(&'b mut self, call: &mut KernelCall<'b>) {
        call.args.arg(self);
    }
}

impl<T> DeviceOut<T> for CudaViewMut<'_, T> {
    fn push<'b>(&'b mut self, call: &mut KernelCall<'b>) {
        call.args.arg(self);
    }
}

/// A buffer the caller left out, for a kernel that tests its pointer
/// before writing (gather.cu's `x` and `y`): pushed as a null pointer.
pub(crate) struct Absent;

/// The null device pointer [`Absent`] pushes.
static NULL: u64 = 0;

impl<T> DeviceOut<T> for Absent {
    fn push<'b>(&'b mut self, call: &mut KernelCall<'b>) {
        call.args.arg(&NULL);
    }
}

/// The three kinds of kernel parameter in the kernel table: a buffer read
/// (`const T*`), a buffer written (`T*`), a value (`T`, a scalar or a
/// `DeviceRepr` struct).
pub(crate) type In<'b, T> = &'b dyn DeviceIn<T>;
pub(crate) type Out<'b, T> = &'b mut dyn DeviceOut<T>;
pub(crate) type Val<'b, T> = &'b T;

/// One kernel launch being assembled by a launcher of [`kernel_table!`].
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
    pub(crate) fn value<T: DeviceRepr>(&mut self, value: &'a T) {
        self.args.arg(value);
    }

    /// Queues the kernel; a bad configuration or argument list is reported
    /// here, a fault while it runs at the next synchronization.
    ///
    /// # Safety
    ///
    /// The arguments were pushed in the order and with the types of the
    /// kernel's C signature, every buffer holds at least the elements the
    /// kernel indexes given the other arguments and `cfg`, and no buffer
    /// the kernel writes is freed or read by the host before the stream
    /// gets past it.
    pub(crate) unsafe fn launch(&mut self, cfg: LaunchConfig) -> Result<()> {
        // SAFETY: the caller's contract above is exactly what cudarc's
        // `launch` asks for.
        unsafe { self.args.launch(cfg) }.map_err(|source| Error::KernelLaunch {
            kernel: self.name,
            source,
        })?;
        Ok(())
    }
}

/// Pushes one argument of a declared kind.
macro_rules! push_arg {
    ($call:ident, In, $arg:ident) => {
        $arg.push(&mut $call)
    };
    ($call:ident, Out, $arg:ident) => {
        $arg.push(&mut $call)
    };
    ($call:ident, Val, $arg:ident) => {
        $call.value($arg)
    };
}

/// One op's kernel table, in its `ops/<op>/cuda.rs`: the module with its
/// source and PTX (build.rs's `<OP>_SRC` and `<OP>_PTX`) and entry points,
/// and for each entry point its parameters, declared once in the order and
/// with the types of its `extern "C"` signature; after them, in `[ … ]`,
/// its GEMM families, each under the sgemm.cuh list that stamps it
/// (`GEMM_VARIANTS` or `GEMM_SQUARE_VARIANTS`) with the parameters every
/// entry point of the family shares.
///
/// Generates the op's `MODULE` (a family's names from `variants.rs`' list;
/// `ops::kernel_modules` lists every op's) and, per kernel, an `unsafe fn`
/// launcher of that name taking `(cuda, cfg, params…)` with the declared
/// types, per family one taking `(cuda, variant, cfg, params…)`: a launch
/// cannot push an argument of another type, in another order, or leave one
/// out. `In<T>` is a `const T*` buffer, `Out<T>` a `T*` buffer, `Val<T>` a
/// value. The test `every_declared_signature_matches_its_source` compares
/// each declaration (the `SIGNATURES` and `FAMILY_SIGNATURES` made here)
/// with the C signature in the source.
macro_rules! kernel_table {
    (
        $module:ident ($src:ident, $ptx:ident) {
            $( $kernel:ident ( $( $arg:ident : $kind:ident<$ty:ty> ),* $(,)? ); )*
        } $( [
            $( $list:ident $family:ident ( $( $farg:ident : $fkind:ident<$fty:ty> ),* $(,)? ); )*
        ] )?
    ) => {
        #[doc = concat!("`", stringify!($module), ".cu` and the entry points launched from it.")]
        pub(crate) const MODULE: $crate::backend::cuda::KernelModule =
            $crate::backend::cuda::KernelModule {
                name: stringify!($module),
                source: $crate::backend::cuda::kernels::ptx::$src,
                ptx: $crate::backend::cuda::kernels::ptx::$ptx,
                functions: $crate::backend::cuda::variants::module_functions!(
                    [$( stringify!($kernel), )*] $( $( $list $family )* )?
                ),
            };

        $(
            #[doc = concat!("Queues `", stringify!($kernel), "` of `", stringify!($module), ".cu`.")]
            ///
            /// # Safety
            ///
            /// Every buffer holds at least the elements the kernel indexes
            /// for the other arguments and `cfg` (the op checked the lengths
            /// against its geometry), and `cfg` is the launch shape the
            /// kernel is written for.
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn $kernel(
                cuda: &$crate::Cuda,
                cfg: cudarc::driver::LaunchConfig,
                $( $arg: $crate::backend::cuda::launch::$kind<'_, $ty> ),*
            ) -> $crate::Result<()> {
                let mut call = cuda.kernel(stringify!($kernel))?;
                $( $crate::backend::cuda::launch::push_arg!(call, $kind, $arg); )*
                // SAFETY: the arguments were pushed in the declared order
                // with the declared types, which match the kernel's C
                // signature (checked against the source by the test
                // `every_declared_signature_matches_its_source`; value
                // structs cross by their `DeviceRepr` impls, each beside
                // its type). Lengths and `cfg` are this function's caller's
                // promise. Outputs are `&mut` borrows, so they alias no
                // input. All work is ordered on the backend's one stream,
                // and cudarc frees device memory in stream order, so no
                // buffer is freed under a running kernel.
                unsafe { call.launch(cfg) }
            }
        )*

        $( $(
            #[doc = concat!(
                "Queues the entry point `variant` of the `", stringify!($family),
                "` family of `", stringify!($module), ".cu`."
            )]
            ///
            /// # Safety
            ///
            /// As for every kernel of the table: the buffers hold what the
            /// kernel indexes for the other arguments and `cfg`.
            #[allow(clippy::too_many_arguments)]
            pub(crate) unsafe fn $family(
                cuda: &$crate::Cuda,
                variant: $crate::backend::cuda::variants::GemmVariant,
                cfg: cudarc::driver::LaunchConfig,
                $( $farg: $crate::backend::cuda::launch::$fkind<'_, $fty> ),*
            ) -> $crate::Result<()> {
                let name: Option<&'static str> = $crate::backend::cuda::variants::gemm_variants!(
                    $crate::backend::cuda::variants::family_kernel_name!(variant $list $family)
                );
                let name = name.ok_or_else(|| $crate::Error::InvalidArgument {
                    op: stringify!($family),
                    reason: format!("no `{}` entry point", variant.suffix()),
                })?;
                let mut call = cuda.kernel(name)?;
                $( $crate::backend::cuda::launch::push_arg!(call, $fkind, $farg); )*
                // SAFETY: as in the launchers of single kernels above: every
                // entry point of the family has the declared signature (the
                // family's one STAMP macro writes it), pushed in order.
                unsafe { call.launch(cfg) }
            }
        )* )?

        /// Each kernel's declared parameters as `(kind, C type)`.
        #[cfg(test)]
        pub(crate) const SIGNATURES: &[(&str, &[(&str, &str)])] = &[$(
            (
                stringify!($kernel),
                &[$( (
                    stringify!($kind),
                    <$ty as $crate::backend::cuda::kernels::CType>::NAME,
                ) ),*],
            ),
        )*];

        /// Each GEMM family's list, name and declared parameters.
        #[cfg(test)]
        pub(crate) const FAMILY_SIGNATURES: &[(&str, &str, &[(&str, &str)])] = &[$( $(
            (
                stringify!($list),
                stringify!($family),
                &[$( (
                    stringify!($fkind),
                    <$fty as $crate::backend::cuda::kernels::CType>::NAME,
                ) ),*],
            ),
        )* )?];
    };
}
pub(crate) use {kernel_table, push_arg};

/// One block of REDUCE_THREADS (reduce.cuh): the kernels that reduce a
/// whole batch in one fixed tree, so a sum has the same bits on every run.
pub(crate) const ONE_REDUCE_BLOCK: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (256, 1, 1),
    shared_mem_bytes: 0,
};

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
