use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{DropoutKernel, check_p};
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::{DropoutArgs, Out, Val, blocks_for};
use crate::{Cuda, Result};

const THREADS: u32 = 256;

/// `dropout_fwd_f32` or `dropout_bwd_f32`: the same signature.
type DropoutLauncher =
    unsafe fn(&Cuda, LaunchConfig, Out<'_, f32>, Val<'_, DropoutArgs>) -> Result<()>;

impl Cuda {
    /// Forward and backward are the same map; `kernel` names the direction.
    fn dropout(
        &self,
        kernel: DropoutLauncher,
        p: f32,
        seed: u64,
        x: &mut CudaSlice<f32>,
    ) -> Result<()> {
        check_p(p)?;
        // As on the CPU, p = 0 leaves the buffer untouched.
        if p == 0.0 || x.is_empty() {
            return Ok(());
        }
        let args = DropoutArgs {
            n: x.len() as u64,
            seed,
            p,
            // The CPU kernel's expression, so kept values scale identically.
            scale: 1.0 / (1.0 - p),
        };
        let cfg = blocks_for("dropout", x.len(), THREADS)?;
        // SAFETY: `args.n` is the length of `x`; every thread checks its
        // index against it.
        unsafe { kernel(self, cfg, x, &args) }
    }
}

impl DropoutKernel for Cuda {
    fn dropout_fwd(&self, p: f32, seed: u64, x: &mut CudaSlice<f32>) -> Result<()> {
        self.dropout(kernels::dropout_fwd_f32, p, seed, x)
    }

    fn dropout_bwd(&self, p: f32, seed: u64, dy: &mut CudaSlice<f32>) -> Result<()> {
        self.dropout(kernels::dropout_bwd_f32, p, seed, dy)
    }
}
