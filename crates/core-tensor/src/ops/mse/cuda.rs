use cudarc::driver::{CudaSlice, DeviceRepr};

use super::{MseGeom, MseKernel};
use crate::backend::cuda::gemm::check_i32;
use crate::backend::cuda::launch::{ONE_REDUCE_BLOCK, kernel_table};
use crate::{Cuda, Result};

// SAFETY: repr(C), two usize fields, mirrored by `MseGeom` in mse.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for MseGeom {}

kernel_table! {
    mse (MSE_SRC, MSE_PTX) {
        mse_fwd_bwd_f32(y: In<f32>, target: In<f32>, dy: Out<f32>, loss_sum: Out<f32>, g: Val<MseGeom>);
        mse_fwd_f32(y: In<f32>, target: In<f32>, loss_sum: Out<f32>, g: Val<MseGeom>);
    }
}

impl MseKernel for Cuda {
    fn mse_fwd_bwd(
        &self,
        g: &MseGeom,
        y: &CudaSlice<f32>,
        target: &CudaSlice<f32>,
        dy: Option<&mut CudaSlice<f32>>,
        loss_sum: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(y, target, dy.as_deref(), loss_sum)?;
        check_i32("mse", &[y.len()])?;
        match dy {
            // SAFETY: `y`, `target` and `dy` were checked against `g`,
            // `loss_sum` holds one element; the kernel reduces with one block.
            Some(dy) => unsafe {
                mse_fwd_bwd_f32(self, ONE_REDUCE_BLOCK, y, target, dy, loss_sum, g)
            },
            // SAFETY: as above, without `dy`.
            None => unsafe { mse_fwd_f32(self, ONE_REDUCE_BLOCK, y, target, loss_sum, g) },
        }
    }
}
