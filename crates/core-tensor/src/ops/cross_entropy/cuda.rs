use cudarc::driver::{CudaSlice, LaunchConfig};

use super::{ClassGeom, CrossEntropyKernel};
use crate::backend::cuda::gemm::check_i32;
use crate::error::check_len;
use crate::{Cuda, Result};

/// One block of REDUCE_THREADS (reduce.cuh): the whole batch in one fixed
/// reduction tree, so the loss sum has the same bits on every run.
const ONE_BLOCK: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (256, 1, 1),
    shared_mem_bytes: 0,
};

impl CrossEntropyKernel for Cuda {
    /// A label not below the class count (an error on the CPU) is reported
    /// by the next synchronization as [`crate::Error::KernelFault`].
    fn cross_entropy_fwd_bwd(
        &self,
        g: &ClassGeom,
        logits: &CudaSlice<f32>,
        labels: &CudaSlice<u8>,
        dlogits: &mut CudaSlice<f32>,
        loss_sum: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(logits, labels)?;
        check_len("cross_entropy", "dlogits", dlogits.len(), logits.len())?;
        check_len("cross_entropy", "loss_sum", loss_sum.len(), 1)?;
        check_i32("cross_entropy", &[logits.len(), labels.len()])?;
        self.with_fault(|fault| {
            self.kernel("cross_entropy_fwd_bwd_f32")?
                .arg(logits)
                .arg(labels)
                .arg(dlogits)
                .arg(loss_sum)
                .arg(fault)
                .arg(g)
                .launch(ONE_BLOCK)
        })
    }
}
