//! A GPU's memory as the backend sees it: what the driver says is free,
//! the bytes the backend's buffers took ([`Backend::allocated_bytes`]),
//! and the driver's out-of-memory error read as [`Error::OutOfMemory`].
//!
//! [`Backend::allocated_bytes`]: crate::Backend::allocated_bytes

use std::sync::atomic::Ordering;

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaSlice, DriverError};

use super::Cuda;
use crate::{Error, Result};

impl Cuda {
    /// `cuda:0 (NVIDIA H100 80GB HBM3)`, for messages.
    pub fn device_name(&self) -> String {
        format!("cuda:{} ({})", self.inner.ordinal, self.inner.name)
    }

    /// A new buffer of `len` `T`s, counted, or the driver's refusal: its
    /// out-of-memory error as [`Error::OutOfMemory`], naming this GPU.
    pub(super) fn allocation<T>(
        &self,
        len: usize,
        made: Result<CudaSlice<T>, DriverError>,
    ) -> Result<CudaSlice<T>> {
        let bytes = (len as u64).saturating_mul(size_of::<T>() as u64);
        match made {
            Ok(slice) => {
                self.inner.allocated.fetch_add(bytes, Ordering::Relaxed);
                Ok(slice)
            }
            Err(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(Error::OutOfMemory {
                device: self.device_name(),
                bytes,
            }),
            Err(e) => Err(e.into()),
        }
    }

    /// This GPU's `(free, total)` memory in bytes, as the driver counts it
    /// now (other processes' allocations and contexts taken).
    pub fn memory(&self) -> Result<(u64, u64)> {
        let (free, total) = self.inner.stream.context().mem_get_info()?;
        Ok((free as u64, total as u64))
    }
}
