use cudarc::driver::{CudaSlice, DeviceRepr};

use super::{Epilogue, MaxPool2dKernel, PoolGeom};
use crate::backend::cuda::gemm::check_i32;
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::error::check_len;
use crate::ops::dropout::cuda::DropoutArgs;
use crate::{Cuda, Result};

// SAFETY: repr(C), four usize fields, mirrored by `PoolGeom` in maxpool2d.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for PoolGeom {}

kernel_table! {
    maxpool2d (MAXPOOL2D_SRC, MAXPOOL2D_PTX) {
        maxpool2d_fwd_f32(x: In<f32>, y: Out<f32>, g: Val<PoolGeom>, relu: Val<u32>, d: Val<DropoutArgs>);
        maxpool2d_bwd_f32(
            x: In<f32>,
            y: In<f32>,
            dy: In<f32>,
            dx: Out<f32>,
            g: Val<PoolGeom>,
            relu: Val<u32>,
            d: Val<DropoutArgs>,
        );
    }
}

const THREADS: u32 = 256;

impl MaxPool2dKernel for Cuda {
    fn maxpool2d_fwd(
        &self,
        g: &PoolGeom,
        then: Epilogue,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, y)?;
        let (relu, d) = DropoutArgs::epilogue(then)?;
        check_i32("maxpool2d", &[x.len()])?;
        if y.is_empty() {
            return Ok(());
        }
        let cfg = blocks_for("maxpool2d", y.len(), THREADS)?;
        // SAFETY: `x` and `y` were checked against `g`; every thread checks
        // its index against the output size.
        unsafe { maxpool2d_fwd_f32(self, cfg, x, y, g, &relu, &d) }
    }

    fn maxpool2d_bwd(
        &self,
        g: &PoolGeom,
        then: Epilogue,
        x: &CudaSlice<f32>,
        y: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, dy)?;
        check_len("maxpool2d", "y", y.len(), dy.len())?;
        check_len("maxpool2d", "dx", dx.len(), x.len())?;
        let (relu, d) = DropoutArgs::epilogue(then)?;
        check_i32("maxpool2d", &[x.len()])?;
        if dx.is_empty() {
            return Ok(());
        }
        // One thread per window, each writing its window and any dropped odd
        // row or column beside it.
        let cfg = blocks_for("maxpool2d", dy.len(), THREADS)?;
        // SAFETY: `x`, `y`, `dy` and `dx` were checked against `g`; every
        // thread checks its index against the output size, and writes only
        // inside its window's rows and columns of the input.
        unsafe { maxpool2d_bwd_f32(self, cfg, x, y, dy, dx, g, &relu, &d) }
    }
}
