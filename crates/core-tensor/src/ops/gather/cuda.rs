use std::ops::Range;

use cudarc::driver::CudaSlice;

use super::GatherKernel;
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::{GatherArgs, blocks_for};
use crate::{Cuda, Result};

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
        x: &mut CudaSlice<f32>,
        y: &mut CudaSlice<u8>,
    ) -> Result<()> {
        super::check::<Self>(images, labels, pixels, indices, &positions, x, y)?;
        let batch = positions.len();
        // As on the CPU, nothing is written when there are no pixels.
        if x.is_empty() {
            return Ok(());
        }
        let args = GatherArgs {
            batch: batch as u64,
            pixels: pixels as u64,
            samples: labels.len() as u64,
            first: positions.start as u64,
        };
        let cfg = blocks_for("gather_batch", x.len(), THREADS)?;
        self.with_fault(|fault| {
            // SAFETY: `check` matched every length to `args` (a sample index
            // past `samples` is caught by the kernel, which sets the fault
            // word instead of reading); every thread checks its index.
            unsafe {
                kernels::gather_batch_u8_f32(self, cfg, images, labels, indices, x, y, fault, &args)
            }
        })
    }
}
