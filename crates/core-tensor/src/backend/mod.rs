//! The device seam: a [`Backend`] owns buffers on one device and moves data
//! between that device and the host. The kernels themselves are per-op traits
//! in [`crate::ops`], implemented by every backend.

mod cpu;
pub mod cuda;
mod host_memory;

pub use cpu::{Cpu, FIXED_PARTIALS, Reductions};
pub use cuda::{
    Cuda, Fp32Tile, GemmStaging, MatmulPrecision, Products, RefusedProducts, cuda_available,
};

use std::fmt::Debug;
use std::ops::{DerefMut, Range};
use std::sync::Arc;

use crate::Result;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for u8 {}
    impl Sealed for u16 {}
    impl Sealed for u32 {}
}

/// Element types a device buffer may hold: `f32` for values, `u8` for the
/// raw dataset (images and labels), `u16` for 16-bit floats' bits,
/// `u32` for sample indices. The cudarc
/// bounds let the CUDA backend allocate and copy them.
pub trait Elem:
    Copy
    + Default
    + Debug
    + Send
    + Sync
    + 'static
    + sealed::Sealed
    + cudarc::driver::DeviceRepr
    + cudarc::driver::ValidAsZeroBits
{
}
impl Elem for f32 {}
impl Elem for u8 {}
impl Elem for u16 {}
impl Elem for u32 {}

/// Memory on one device, and the copies between it and the host.
///
/// Architecture invariant: a backend never changes what a kernel computes,
/// only where; every op has a CPU implementation that is the reference.
pub trait Backend: Clone + Debug + Send + Sync + 'static {
    /// An owned, fixed-length buffer of `T` on the device.
    type Storage<T: Elem>: Debug + Send + Sync;

    /// Host memory for staging `f32` copies to and from the device, e.g. for
    /// a host-side collective: page-locked on a GPU (DMA straight from and
    /// into it, about twice as fast as pageable memory), a `Vec` on the CPU.
    type Staging: DerefMut<Target = [f32]> + Send + 'static;

    /// A zeroed staging buffer of `len` elements.
    fn staging(&self, len: usize) -> Result<Self::Staging>;

    /// Whether buffers live in host memory, so that reading a few values
    /// back costs no synchronisation with a device.
    const IN_HOST_MEMORY: bool;

    /// A one-line description for logs, e.g. `cpu (2 threads)`.
    fn describe(&self) -> String;

    /// A buffer of `len` zeros. A GPU cannot allocate an empty buffer, so
    /// `len` 0 is an error on CUDA.
    fn zeros<T: Elem>(&self, len: usize) -> Result<Self::Storage<T>>;

    /// A new buffer holding a copy of `host` (not empty on CUDA).
    fn upload<T: Elem>(&self, host: &[T]) -> Result<Self::Storage<T>>;

    /// The bytes [`Backend::zeros`] and [`Backend::upload`] have handed
    /// out so far on this device, by this backend and its clones, freed or
    /// not: the difference across a call that makes buffers is their size,
    /// which a caller can measure on small ones before it asks for large
    /// ones.
    fn allocated_bytes(&self) -> u64;

    /// For a backend in host memory: [`Backend::allocated_bytes`]. Zeroed
    /// pages take no memory until first written, so a caller can compare
    /// this with what the machine has before training touches them.
    /// `None` for a device's own memory.
    fn allocated_host_bytes(&self) -> Option<u64> {
        Self::IN_HOST_MEMORY.then(|| self.allocated_bytes())
    }

    /// The most a kernel call takes on the device for itself, on top of
    /// its buffers, and frees when queued (CUDA: a split-K product's
    /// workspace): a caller sizing its buffers leaves this much free.
    fn transient_bytes(&self) -> u64 {
        0
    }

    /// The device's name (`cuda:0 (NVIDIA H100 80GB HBM3)`) and its free
    /// memory in bytes, as its driver counts it now; `None` for host
    /// memory (the machine's to say).
    fn free_device_memory(&self) -> Result<Option<(String, u64)>>;

    /// The number of elements in `storage`.
    fn len<T: Elem>(storage: &Self::Storage<T>) -> usize;

    /// A read-only buffer the ranks of one process may share (a data set
    /// read once, trained on by rank threads): in host memory the host
    /// allocation itself, on a GPU a device copy.
    type Shared<T: Elem>: Debug + Send + Sync;

    /// `host` as a read-only buffer: on the CPU the same allocation,
    /// counted once more (no copy); on a GPU an upload (not empty).
    fn share<T: Elem>(&self, host: &Arc<Vec<T>>) -> Result<Self::Shared<T>>;

    /// The number of elements in `shared`.
    fn shared_len<T: Elem>(shared: &Self::Shared<T>) -> usize;

    /// Copies `storage[range]` into `host` (whose length must match).
    fn read_range<T: Elem>(
        &self,
        storage: &Self::Storage<T>,
        range: Range<usize>,
        host: &mut [T],
    ) -> Result<()>;

    /// Copies `host` into `storage[offset..offset + host.len()]`; `host` may
    /// be reused as soon as this returns.
    fn write_range<T: Elem>(
        &self,
        host: &[T],
        storage: &mut Self::Storage<T>,
        offset: usize,
    ) -> Result<()>;

    /// Sets every element of `storage` to `value`.
    fn fill<T: Elem>(&self, storage: &mut Self::Storage<T>, value: T) -> Result<()>;

    /// Waits until all work queued on the device has finished.
    fn synchronize(&self) -> Result<()>;

    /// A point in the device's stream of work, for timing it without
    /// waiting for it: on the CPU the host clock (its kernels run as they
    /// are called), on a GPU an event recorded on the compute stream.
    type Mark: Send;

    /// A mark recorded now, after everything queued so far.
    fn mark(&self) -> Result<Self::Mark>;

    /// Records `mark` again, now: marks are reused, so that timing every
    /// step creates nothing.
    fn record_mark(&self, mark: &mut Self::Mark) -> Result<()>;

    /// Seconds of device time from `start` to `end`. Waits until the device
    /// has reached `end`, so a caller reads marks where it synchronises
    /// anyway (the trainer: once every few steps, and per epoch).
    fn seconds_between(&self, start: &Self::Mark, end: &Self::Mark) -> Result<f64>;

    /// The whole buffer, copied to the host.
    fn download<T: Elem>(&self, storage: &Self::Storage<T>) -> Result<Vec<T>> {
        let mut host = vec![T::default(); Self::len(storage)];
        self.read_range(storage, 0..host.len(), &mut host)?;
        Ok(host)
    }
}
