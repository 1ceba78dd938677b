use cudarc::driver::CudaSlice;

use super::AccuracyKernel;
use crate::backend::cuda::gemm::check_i32;
use crate::backend::cuda::launch::{ONE_REDUCE_BLOCK, kernel_table};
use crate::error::check_len;
use crate::ops::ClassGeom;
use crate::{Cuda, Result};

kernel_table! {
    accuracy (ACCURACY_SRC, ACCURACY_PTX) {
        count_correct_f32(logits: In<f32>, labels: In<u8>, correct: Out<f32>, g: Val<ClassGeom>);
    }
}

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
        unsafe { count_correct_f32(self, ONE_REDUCE_BLOCK, logits, labels, correct, g) }
    }
}
