use cudarc::driver::CudaSlice;

use super::{AdamKernel, AdamScalars};
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::blocks_for;
use crate::error::check_len;
use crate::ops::GUARD_LEN;
use crate::{Cuda, Result};

const THREADS: u32 = 256;

impl AdamKernel for Cuda {
    fn adam_step(
        &self,
        s: &AdamScalars,
        params: &mut CudaSlice<f32>,
        grads: &CudaSlice<f32>,
        m: &mut CudaSlice<f32>,
        v: &mut CudaSlice<f32>,
        guard: &CudaSlice<u32>,
    ) -> Result<()> {
        for (name, len) in [("grads", grads.len()), ("m", m.len()), ("v", v.len())] {
            check_len("adam", name, len, params.len())?;
        }
        check_len("adam", "guard", guard.len(), GUARD_LEN)?;
        if params.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("adam", params.len(), THREADS)?;
        let n = params.len() as u64;
        // SAFETY: `grads`, `m` and `v` have `n` elements like `params`, the
        // guard its two; every thread checks its index against `n`.
        unsafe { kernels::adam_step_f32(self, cfg, params, grads, m, v, guard, s, &n) }
    }
}
