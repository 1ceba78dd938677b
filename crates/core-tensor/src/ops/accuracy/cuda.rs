use cudarc::driver::{CudaSlice, LaunchConfig};

use super::AccuracyKernel;
use crate::backend::cuda::gemm::check_i32;
use crate::error::check_len;
use crate::ops::ClassGeom;
use crate::{Cuda, Result};

/// One block of REDUCE_THREADS (reduce.cuh) counts the whole batch.
const ONE_BLOCK: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (256, 1, 1),
    shared_mem_bytes: 0,
};

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
        self.kernel("count_correct_f32")?
            .arg(logits)
            .arg(labels)
            .arg(correct)
            .arg(g)
            .launch(ONE_BLOCK)
    }
}
