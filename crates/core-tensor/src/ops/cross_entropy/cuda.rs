use cudarc::driver::{CudaSlice, DeviceRepr};

use super::{ClassGeom, CrossEntropyKernel};
use crate::backend::cuda::gemm::check_i32;
use crate::backend::cuda::launch::{ONE_REDUCE_BLOCK, kernel_table};
use crate::error::check_len;
use crate::{Cuda, Result};

// SAFETY: repr(C), two usize fields, mirrored by `ClassGeom` in
// cross_entropy.cu and accuracy.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for ClassGeom {}

kernel_table! {
    cross_entropy (CROSS_ENTROPY_SRC, CROSS_ENTROPY_PTX) {
        cross_entropy_fwd_bwd_f32(
            logits: In<f32>,
            labels: In<u8>,
            dlogits: Out<f32>,
            loss_sum: Out<f32>,
            fault: Out<u32>,
            g: Val<ClassGeom>,
        );
    }
}

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
            // SAFETY: `logits`, `labels` and `dlogits` were checked against
            // `g`, `loss_sum` and the fault word hold one element each; the
            // kernel reduces with one block.
            unsafe {
                cross_entropy_fwd_bwd_f32(
                    self,
                    ONE_REDUCE_BLOCK,
                    logits,
                    labels,
                    dlogits,
                    loss_sum,
                    fault,
                    g,
                )
            }
        })
    }
}
