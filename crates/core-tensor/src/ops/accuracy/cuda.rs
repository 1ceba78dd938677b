use cudarc::driver::CudaSlice;

use super::AccuracyKernel;
use crate::backend::cuda::gemm::check_i32;
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::ONE_REDUCE_BLOCK;
use crate::error::check_len;
use crate::ops::ClassGeom;
use crate::{Cuda, Result};

impl AccuracyKernel for Cuda {
    fn count_correct(
        &self,
        g: &ClassGeom,
        logits: &CudaSlice<f32>,
        labels: &CudaSlice<u8>,
        correct: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(logits, labels)?;
        check_len("count_correct", "correct", correct.len(), 1)?;
        check_i32("count_correct", &[logits.len(), labels.len()])?;
        // SAFETY: `logits` and `labels` were checked against `g`, `correct`
        // holds its one element; the kernel reduces with one block.
        unsafe { kernels::count_correct_f32(self, ONE_REDUCE_BLOCK, logits, labels, correct, g) }
    }
}
