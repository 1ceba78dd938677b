//! The CUDA backend: buffers are cudarc `CudaSlice`s on one GPU, every op is a
//! kernel from `src/ops/<op>/<op>.cu` queued on one stream.
//!
//! * Libraries are loaded at first use, never linked: a machine without the
//!   NVIDIA driver (`libcuda.so`) or NVRTC (`libnvrtc.so`) gets a typed
//!   [`Error`] naming the library, and [`cuda_available`] lets a caller pick
//!   the CPU instead.
//! * Kernels come from PTX that `nvcc` embedded at build time, when it was
//!   there and the driver accepts it; else NVRTC compiles the embedded
//!   sources for the GPU's exact architecture at [`Cuda::new`] (once per
//!   process and architecture; see `modules.rs`).
//! * Ops queue work without waiting; [`Backend::read_range`] and
//!   [`Backend::synchronize`] wait, and report the asynchronous errors: a
//!   faulting kernel, or invalid data a kernel found (see `fault.rs`).
//! * Kernels are launched through typed launchers that each op's kernel
//!   table (`kernel_table!` in `launch.rs`, in `src/ops/<op>/cuda.rs`)
//!   declares: `unsafe fn`s whose callers (the same files, `gemm.rs`,
//!   `ops/gemm_layer.rs`) say in a `// SAFETY:` which length checks they
//!   made. The FFI itself is in `launch.rs` and `nvrtc.rs`. This module
//!   knows no op: the modules it loads are handed to [`Cuda::open`].

mod device_memory;
mod fault;
pub(crate) mod gemm;
mod kernel_cache;
pub(crate) mod kernels;
pub(crate) mod launch;
mod modules;
mod nvrtc;
mod pinned;
mod products;
pub(crate) mod variants;

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

pub use cudarc;
use cudarc::driver::sys::{CUevent_flags, CUresult};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut,
};
pub use kernel_cache::KERNEL_CACHE_VAR;
pub use kernels::KernelModule;
pub use modules::{compile_cubin, compile_ptx, nvrtc_version};
pub use pinned::PinnedVec;
pub use products::{Fp32Tile, GemmStaging, MatmulPrecision, Products, RefusedProducts};
pub use variants::GemmVariant;

use super::{Backend, Elem};
use crate::error::check_len;
use crate::{Error, Result};

/// The number of CUDA devices this process can use: `Ok(0)` when the driver
/// is installed but sees no GPU, an error naming the library when the driver
/// is missing. Never panics, so `--device auto` can fall back to the CPU.
pub fn cuda_available() -> Result<usize> {
    launch::require_driver()?;
    if let Err(e) = cudarc::driver::result::init() {
        return match e.0 {
            CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
            _ => Err(e.into()),
        };
    }
    let count = cudarc::driver::result::device::get_count()?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// One GPU, one stream, and every kernel loaded on it.
///
/// Cloning is cheap and shares the stream, so work queued through any clone
/// runs in program order.
#[derive(Clone)]
pub struct Cuda {
    inner: Arc<Inner>,
    products: Products,
    /// Whether models take the fused ops (`Conv2dPoolKernel::fuses`).
    fusion: bool,
}

struct Inner {
    ordinal: usize,
    name: String,
    compute_cap: (i32, i32),
    kernels_from: String,
    stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
    /// Bits set by kernels that met invalid input, checked when syncing.
    fault: Mutex<CudaSlice<u32>>,
    /// What `zeros` and `upload` handed out: [`Backend::allocated_bytes`].
    allocated: AtomicU64,
}

impl fmt::Debug for Cuda {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cuda")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("products", &self.products)
            .field("fusion", &self.fusion)
            .finish()
    }
}

impl Cuda {
    /// Opens GPU `ordinal` with `modules` loaded on it (every op's: the
    /// public constructors, `Cuda::new` and the others, are the ops'). TF32,
    /// bf16 or cp.async on a GPU older than compute capability 8.0 is
    /// [`Error::GpuTooOld`]; embedded PTX for an older architecture is then
    /// passed over for NVRTC's code for this GPU (it would leave them out).
    pub(crate) fn open(
        ordinal: usize,
        products: Products,
        modules: &'static [KernelModule],
    ) -> Result<Self> {
        let count = cuda_available()?;
        if ordinal >= count {
            return Err(Error::NoCudaDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal)?;
        launch::untracked_streams(&ctx);
        let compute_cap = ctx.compute_capability()?;
        let feature = products.needs_ampere();
        let min_arch = match feature {
            None => 0,
            Some((feature, fix)) if compute_cap.0 < 8 => {
                return Err(Error::GpuTooOld {
                    feature,
                    device: ctx.name()?,
                    have: compute_cap,
                    need: (8, 0),
                    fix,
                });
            }
            Some(_) => 80,
        };
        let loaded = modules::load_all(&ctx, modules, compute_cap, min_arch)?;
        // One stream for all of this backend's work (see `untracked_streams`).
        let stream = ctx.default_stream();
        let fault = Mutex::new(stream.alloc_zeros::<u32>(1)?);
        Ok(Self {
            inner: Arc::new(Inner {
                ordinal,
                name: ctx.name()?,
                compute_cap,
                kernels_from: loaded.origin,
                stream,
                functions: loaded.functions,
                fault,
                allocated: AtomicU64::new(0),
            }),
            products,
            fusion: true,
        })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The GPU's name, as the driver reports it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The stream every op of this backend runs on, for work that must be
    /// ordered with it (e.g. a collective on the gradient buffer).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    /// The GPU's UUID: two ranks with the same one drive the same GPU, even
    /// when `CUDA_VISIBLE_DEVICES` numbers it differently for each.
    pub fn uuid(&self) -> Result<[u8; 16]> {
        let uuid = self.inner.stream.context().uuid()?;
        Ok(uuid.bytes.map(|b| b as u8))
    }

    /// A new stream on this GPU for work that overlaps the backend's (the
    /// NCCL collectives). Nothing orders it against [`Cuda::stream`]: its
    /// user records events on one and makes the other wait for them.
    pub fn side_stream(&self) -> Result<Arc<CudaStream>> {
        Ok(self.inner.stream.context().new_stream()?)
    }

    /// A zeroed scratch buffer; freed in stream order when dropped, so it
    /// may be dropped right after the kernels using it are queued.
    pub(crate) fn scratch(&self, len: usize) -> Result<CudaSlice<f32>> {
        self.zeros(len)
    }

    pub(crate) fn function(&self, name: &'static str) -> Result<&CudaFunction> {
        self.inner
            .functions
            .get(name)
            .ok_or_else(|| Error::KernelBuild {
                module: "registry",
                reason: format!("no kernel named `{name}` was loaded"),
            })
    }

    /// Runs `f` with the fault word, for kernels that report invalid input.
    pub(crate) fn with_fault<R>(&self, f: impl FnOnce(&mut CudaSlice<u32>) -> R) -> R {
        // A panic elsewhere cannot leave the word half-written: it is only
        // touched by queued kernels and `check_faults`.
        let mut fault = self
            .inner
            .fault
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(&mut fault)
    }

    /// After a stream sync: turns fault bits into an error, clearing them.
    fn check_faults(&self) -> Result<()> {
        self.with_fault(|word| {
            let mut bits = [0u32];
            self.inner.stream.memcpy_dtoh(&*word, &mut bits[..])?;
            if bits[0] == 0 {
                return Ok(());
            }
            self.inner.stream.memset_zeros(word)?;
            Err(Error::KernelFault(fault::describe(bits[0])))
        })
    }
}

impl Backend for Cuda {
    type Storage<T: Elem> = CudaSlice<T>;
    type Staging = PinnedVec;
    const IN_HOST_MEMORY: bool = false;

    fn staging(&self, len: usize) -> Result<PinnedVec> {
        Ok(PinnedVec::zeros(self.inner.stream.context(), len))
    }

    fn describe(&self) -> String {
        let (major, minor) = self.inner.compute_cap;
        format!(
            "cuda:{} ({}, sm_{major}{minor}, kernels from {}{})",
            self.inner.ordinal,
            self.inner.name,
            self.inner.kernels_from,
            self.products.describe()
        )
    }

    fn zeros<T: Elem>(&self, len: usize) -> Result<CudaSlice<T>> {
        not_empty("zeros", len)?;
        self.allocation(len, self.inner.stream.alloc_zeros(len))
    }

    fn upload<T: Elem>(&self, host: &[T]) -> Result<CudaSlice<T>> {
        not_empty("upload", host.len())?;
        self.allocation(host.len(), self.inner.stream.clone_htod(host))
    }

    fn allocated_bytes(&self) -> u64 {
        self.inner.allocated.load(Ordering::Relaxed)
    }

    fn free_device_memory(&self) -> Result<Option<(String, u64)>> {
        Ok(Some((self.device_name(), self.memory()?.0)))
    }

    fn transient_bytes(&self) -> u64 {
        (gemm::MAX_WORKSPACE_LEN * size_of::<f32>()) as u64
    }

    fn len<T: Elem>(storage: &CudaSlice<T>) -> usize {
        storage.len()
    }

    type Shared<T: Elem> = CudaSlice<T>;

    fn share<T: Elem>(&self, host: &Arc<Vec<T>>) -> Result<CudaSlice<T>> {
        self.upload(host)
    }

    fn shared_len<T: Elem>(shared: &CudaSlice<T>) -> usize {
        shared.len()
    }

    fn read_range<T: Elem>(
        &self,
        storage: &CudaSlice<T>,
        range: Range<usize>,
        host: &mut [T],
    ) -> Result<()> {
        let src = view("read_range", storage, range)?;
        check_len("read_range", "host", host.len(), src.len())?;
        self.inner.stream.memcpy_dtoh(&src, host)?;
        self.synchronize()
    }

    fn write_range<T: Elem>(
        &self,
        host: &[T],
        storage: &mut CudaSlice<T>,
        offset: usize,
    ) -> Result<()> {
        let mut dst = view_mut_at("write_range", storage, offset, host.len())?;
        self.inner.stream.memcpy_htod(host, &mut dst)?;
        // From page-locked memory (a `PinnedVec`) the copy is asynchronous;
        // wait for it, so `host` may be reused at once whatever it is.
        self.inner.stream.synchronize()?;
        Ok(())
    }

    fn fill<T: Elem>(&self, storage: &mut CudaSlice<T>, value: T) -> Result<()> {
        launch::fill(&self.inner.stream, storage, value)
    }

    fn synchronize(&self) -> Result<()> {
        self.inner.stream.synchronize()?;
        self.check_faults()
    }

    type Mark = CudaEvent;

    fn mark(&self) -> Result<CudaEvent> {
        // cudarc's default event flags turn timing off, and the driver then
        // refuses `cuEventElapsedTime`: ask for a timing event.
        let event = self
            .inner
            .stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        event.record(&self.inner.stream)?;
        Ok(event)
    }

    fn record_mark(&self, mark: &mut CudaEvent) -> Result<()> {
        Ok(mark.record(&self.inner.stream)?)
    }

    fn seconds_between(&self, start: &CudaEvent, end: &CudaEvent) -> Result<f64> {
        let ms = start.elapsed_ms(end)?;
        Ok(f64::from(ms) / 1e3)
    }
}

/// The driver refuses to allocate zero bytes (`CUDA_ERROR_INVALID_VALUE`);
/// say so in words instead.
fn not_empty(op: &'static str, len: usize) -> Result<()> {
    if len == 0 {
        return Err(Error::InvalidArgument {
            op,
            reason: "a CUDA buffer must hold at least one element".into(),
        });
    }
    Ok(())
}

/// `storage[range]`, or an error where cudarc would panic.
pub(crate) fn view<'a, T>(
    op: &'static str,
    storage: &'a CudaSlice<T>,
    range: Range<usize>,
) -> Result<CudaView<'a, T>> {
    let len = storage.len();
    storage
        .try_slice(range.clone())
        .ok_or_else(|| out_of_bounds(op, &range, len))
}

/// `&mut storage[range]`, or an error where cudarc would panic.
pub(crate) fn view_mut<'a, T>(
    op: &'static str,
    storage: &'a mut CudaSlice<T>,
    range: Range<usize>,
) -> Result<CudaViewMut<'a, T>> {
    let len = storage.len();
    storage
        .try_slice_mut(range.clone())
        .ok_or_else(|| out_of_bounds(op, &range, len))
}

/// The `len` elements of `storage` from `offset` on, as [`view_mut`]: where
/// a copy into `storage` at `offset` lands.
fn view_mut_at<'a, T>(
    op: &'static str,
    storage: &'a mut CudaSlice<T>,
    offset: usize,
    len: usize,
) -> Result<CudaViewMut<'a, T>> {
    view_mut(op, storage, offset..offset.saturating_add(len))
}

fn out_of_bounds(op: &'static str, range: &Range<usize>, len: usize) -> Error {
    Error::InvalidArgument {
        op,
        reason: format!("range {range:?} is outside a buffer of {len} elements"),
    }
}
