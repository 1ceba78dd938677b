use cudarc::driver::CudaSlice;

use super::ReluKernel;
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::error::check_len;
use crate::ops::Dropout;
use crate::ops::dropout::cuda::DropoutArgs;
use crate::{Cuda, Result};

kernel_table! {
    relu (RELU_SRC, RELU_PTX) {
        relu_fwd_f32(x: Out<f32>, n: Val<u64>, d: Val<DropoutArgs>);
        relu_bwd_f32(y: In<f32>, dy: Out<f32>, n: Val<u64>, d: Val<DropoutArgs>);
    }
}

const THREADS: u32 = 256;

impl ReluKernel for Cuda {
    fn relu_fwd(&self, dropout: Dropout, x: &mut CudaSlice<f32>) -> Result<()> {
        let d = DropoutArgs::new(dropout)?;
        if x.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("relu", x.len(), THREADS)?;
        let n = x.len() as u64;
        // SAFETY: `n` is the length of `x`; every thread checks its index.
        unsafe { relu_fwd_f32(self, cfg, x, &n, &d) }
    }

    fn relu_bwd(
        &self,
        dropout: Dropout,
        y: &CudaSlice<f32>,
        dy: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let d = DropoutArgs::new(dropout)?;
        check_len("relu_bwd", "dy", dy.len(), y.len())?;
        if y.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("relu", y.len(), THREADS)?;
        let n = y.len() as u64;
        // SAFETY: `dy` was checked to have `n` elements like `y`; every
        // thread checks its index.
        unsafe { relu_bwd_f32(self, cfg, y, dy, &n, &d) }
    }
}
