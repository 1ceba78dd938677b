use cudarc::driver::CudaSlice;

use super::{Conv2dPoolKernel, check_pooled};
use crate::backend::cuda::gemm::{GemmPlan, check_i32};
use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::backend::cuda::view;
use crate::error::check_len;
use crate::ops::PoolGeom;
use crate::ops::conv2d::Conv2dLaunch;
use crate::ops::dropout::cuda::DropoutArgs;
use crate::ops::{Conv2dGeom, Epilogue, LayerKernel, ParamAt};
use crate::{Cuda, Result};

kernel_table! {
    conv2d_pool (CONV2D_POOL_SRC, CONV2D_POOL_PTX) {
        conv2d_pool_argmax_f32(
            a: In<f32>,
            y: Out<f32>,
            arg: Out<u8>,
            g: Val<PoolGeom>,
            relu: Val<u32>,
            d: Val<DropoutArgs>,
        );
        conv2d_pool_bwd_f32(
            arg: In<u8>,
            y: In<f32>,
            dy: In<f32>,
            da: Out<f32>,
            g: Val<PoolGeom>,
            relu: Val<u32>,
            d: Val<DropoutArgs>,
        );
    } [
        GEMM_SQUARE_VARIANTS conv2d_pool_fwd(
            x: In<f32>,
            w: In<f32>,
            bias: In<f32>,
            y: Out<f32>,
            arg: Out<u8>,
            p: Val<Conv2dLaunch>,
            relu: Val<u32>,
            d: Val<DropoutArgs>,
        );
    ]
}

/// Threads of the pooling kernels, one per window.
const THREADS: u32 = 256;

impl Conv2dPoolKernel for Cuda {
    fn conv2d_pool_fwd(
        &self,
        g: &Conv2dGeom,
        then: Epilogue,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
        argmax: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let pool = check_pooled::<Self>(g, y, argmax)?;
        let lens = g.lens()?;
        check_len("conv2d_pool", "x", x.len(), lens.x)?;
        at.check("conv2d_pool", lens.weight, lens.bias, params.len())?;
        check_i32("conv2d_pool", &[x.len(), lens.y, lens.weight])?;
        let (relu, d) = DropoutArgs::epilogue(then)?;
        if y.is_empty() {
            return Ok(());
        }
        // The product's columns are the windows' pixels, four per window.
        let cols = 4 * pool.output_len() / g.out_channels;
        let plan = GemmPlan::new(
            "conv2d_pool",
            g.out_channels,
            cols,
            g.patch_len(),
            self.gemm_tile(),
        )?;
        if plan.is_split() || plan.is_wide() {
            // Split K has no tile that holds whole sums, and a wide tile
            // (64 x 256 floats) does not fit the static shared memory beside
            // its staging: the unfused product, then a pool that writes the
            // argmax too.
            let mut a = self.scratch(lens.y)?;
            self.layer_fwd(g, x, params, at, &mut a)?;
            let cfg = blocks_for("conv2d_pool", y.len(), THREADS)?;
            // SAFETY: `a` holds the convolution's output, which `pool`
            // pools into `y` and `argmax` (checked against `pool`); every
            // thread checks its window against the output size.
            return unsafe { conv2d_pool_argmax_f32(self, cfg, &a, y, argmax, &pool, &relu, &d) };
        }
        let w = view("conv2d_pool", params, at.weight.clone())?;
        let b = view("conv2d_pool", params, at.bias.clone())?;
        let variant = plan.variant(self.products());
        let (cfg, args) = (plan.tiles(), plan.args(*g));
        // SAFETY: `x`, `W` and `b` were checked against the geometry, `y`
        // and `argmax` against its pooling; the plan is the product of the
        // kernel's window-ordered columns, unsplit and in the square tiles
        // (the family's only ones), so each block's tile holds whole
        // windows, and its stores stay inside the tile.
        unsafe { conv2d_pool_fwd(self, variant, cfg, x, &w, &b, y, argmax, &args, &relu, &d) }
    }

    fn conv2d_pool_bwd(
        &self,
        g: &Conv2dGeom,
        then: Epilogue,
        (x, params, at): (&CudaSlice<f32>, &CudaSlice<f32>, &ParamAt),
        (argmax, y, dy): (&CudaSlice<u8>, &CudaSlice<f32>, &CudaSlice<f32>),
        da: &mut CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        let pool = check_pooled::<Self>(g, dy, argmax)?;
        check_len("conv2d_pool", "y", y.len(), dy.len())?;
        check_len("conv2d_pool", "da", da.len(), pool.input_len())?;
        check_i32("conv2d_pool", &[da.len()])?;
        let (relu, d) = DropoutArgs::epilogue(then)?;
        if !dy.is_empty() {
            let cfg = blocks_for("conv2d_pool", dy.len(), THREADS)?;
            // SAFETY: `argmax`, `y`, `dy` and `da` were checked against the
            // pooling; every thread checks its window against the output
            // size and writes only inside its window's rows and columns.
            unsafe { conv2d_pool_bwd_f32(self, cfg, argmax, y, dy, da, &pool, &relu, &d)? };
        }
        self.layer_bwd(g, x, params, at, da, grads, dx)
    }

    fn fuses(&self) -> bool {
        self.fusion()
    }
}
