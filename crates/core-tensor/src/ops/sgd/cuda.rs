use cudarc::driver::CudaSlice;

use super::SgdKernel;
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::error::check_len;
use crate::ops::GUARD_LEN;
use crate::{Cuda, Result};

kernel_table! {
    sgd (SGD_SRC, SGD_PTX) {
        sgd_step_f32(params: Out<f32>, grads: In<f32>, guard: In<u32>, minus_lr: Val<f32>, n: Val<u64>);
    }
}

const THREADS: u32 = 256;

impl SgdKernel for Cuda {
    fn sgd_step(
        &self,
        lr: f32,
        params: &mut CudaSlice<f32>,
        grads: &CudaSlice<f32>,
        guard: &CudaSlice<u32>,
    ) -> Result<()> {
        check_len("sgd", "grads", grads.len(), params.len())?;
        check_len("sgd", "guard", guard.len(), GUARD_LEN)?;
        if params.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("sgd", params.len(), THREADS)?;
        let n = params.len() as u64;
        // SAFETY: `grads` has `n` elements like `params`, the guard its two;
        // every thread checks its index against `n`.
        unsafe { sgd_step_f32(self, cfg, params, grads, guard, &-lr, &n) }
    }
}
