use cudarc::driver::CudaSlice;

use super::{FiniteKernel, check};
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::blocks_for;
use crate::{Cuda, Result};

const THREADS: u32 = 256;

impl FiniteKernel for Cuda {
    fn guard_finite(
        &self,
        step: u32,
        loss: &CudaSlice<f32>,
        values: &CudaSlice<f32>,
        guard: &mut CudaSlice<u32>,
    ) -> Result<()> {
        check(step, loss.len(), values.len(), guard.len())?;
        // At least one thread, for the loss.
        let cfg = blocks_for("guard_finite", values.len().max(1), THREADS)?;
        let n = values.len() as u64;
        // SAFETY: `check` ran: one loss, a two-word guard, `n` values; every
        // thread checks its index against `n`.
        unsafe { kernels::guard_finite_f32(self, cfg, values, loss, guard, &step, &n) }
    }
}
