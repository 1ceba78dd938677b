use std::ops::Range;

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::GatherKernel;
use crate::backend::cuda::launch::{Absent, DeviceOut, blocks_for, kernel_table};
use crate::{Cuda, Result};

/// Launch parameters of the gather kernel; mirrored by `GatherArgs` in
/// gather.cu.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct GatherArgs {
    pub batch: u64,
    pub pixels: u64,
    pub samples: u64,
    pub first: u64,
    /// Threads per sample: `pixels` when the images are gathered (at
    /// least 1), else 1.
    pub lanes: u64,
}

// SAFETY: repr(C), five u64 fields, mirrored by `GatherArgs` in gather.cu;
// passed by value, it holds no pointer.
unsafe impl DeviceRepr for GatherArgs {}

kernel_table! {
    gather (GATHER_SRC, GATHER_PTX) {
        gather_batch_u8_f32(
            images: In<u8>,
            labels: In<u8>,
            indices: In<u32>,
            x: Out<f32>,
            y: Out<u8>,
            fault: Out<u32>,
            a: Val<GatherArgs>,
        );
    }
}

const THREADS: u32 = 256;

impl GatherKernel for Cuda {
    /// A sample index past the dataset (an error on the CPU) is reported by
    /// the next synchronization as [`crate::Error::KernelFault`].
    fn gather_batch(
        &self,
        images: &CudaSlice<u8>,
        labels: &CudaSlice<u8>,
        pixels: usize,
        indices: &CudaSlice<u32>,
        positions: Range<usize>,
        x: Option<&mut CudaSlice<f32>>,
        y: Option<&mut CudaSlice<u8>>,
    ) -> Result<()> {
        super::check::<Self>(
            images,
            labels,
            pixels,
            indices,
            &positions,
            x.as_deref(),
            y.as_deref(),
        )?;
        let batch = positions.len();
        if batch == 0 {
            return Ok(());
        }
        let lanes = if x.is_some() { pixels.max(1) } else { 1 };
        let args = GatherArgs {
            batch: batch as u64,
            pixels: pixels as u64,
            samples: labels.len() as u64,
            first: positions.start as u64,
            lanes: lanes as u64,
        };
        let cfg = blocks_for("gather_batch", batch * lanes, THREADS)?;
        let (mut no_x, mut no_y) = (Absent, Absent);
        let x: &mut dyn DeviceOut<f32> = match x {
            Some(x) => x,
            None => &mut no_x,
        };
        let y: &mut dyn DeviceOut<u8> = match y {
            Some(y) => y,
            None => &mut no_y,
        };
        self.with_fault(|fault| {
            // SAFETY: `check` matched every given length to `args`; a buffer
            // left out goes as a null pointer, which the kernel tests before
            // writing; a sample index past `samples` is caught by the kernel,
            // which sets the fault word instead of reading; every thread
            // checks its index against `batch · lanes`.
            unsafe { gather_batch_u8_f32(self, cfg, images, labels, indices, x, y, fault, &args) }
        })
    }
}
