use cudarc::driver::CudaSlice;

use super::{DropoutKernel, check_p};
use crate::backend::cuda::launch::{DropoutArgs, blocks_for};
use crate::{Cuda, Result};

const THREADS: u32 = 256;

impl Cuda {
    /// Forward and backward are the same map; `kernel` names the direction.
    fn dropout(
        &self,
        kernel: &'static str,
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
        self.kernel(kernel)?.arg(x).arg(&args).launch(cfg)
    }
}

impl DropoutKernel for Cuda {
    fn dropout_fwd(&self, p: f32, seed: u64, x: &mut CudaSlice<f32>) -> Result<()> {
        self.dropout("dropout_fwd_f32", p, seed, x)
    }

    fn dropout_bwd(&self, p: f32, seed: u64, dy: &mut CudaSlice<f32>) -> Result<()> {
        self.dropout("dropout_bwd_f32", p, seed, dy)
    }
}
