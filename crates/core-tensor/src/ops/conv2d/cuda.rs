use cudarc::driver::{CudaSlice, CudaView, LaunchConfig};

use super::{Conv2dGeom, Conv2dKernel};
use crate::Cuda;
use crate::Result;
use crate::backend::cuda::gemm::{GemmKernels, GemmOperands, GemmPlan, check_i32};
use crate::backend::cuda::{view, view_mut};
use crate::ops::ParamAt;

/// Threads of `conv2d_bwd_bias_f32` (REDUCE_THREADS in reduce.cuh).
const BIAS_THREADS: u32 = 256;

const FWD: GemmKernels = GemmKernels {
    whole: "conv2d_fwd_f32",
    partial: "conv2d_fwd_partial_f32",
    reduce: "conv2d_fwd_reduce_f32",
};
const BWD_WEIGHT: GemmKernels = GemmKernels {
    whole: "conv2d_bwd_weight_f32",
    partial: "conv2d_bwd_weight_partial_f32",
    reduce: "conv2d_bwd_weight_reduce_f32",
};
const BWD_INPUT: GemmKernels = GemmKernels {
    whole: "conv2d_bwd_input_f32",
    partial: "conv2d_bwd_input_partial_f32",
    reduce: "conv2d_bwd_input_reduce_f32",
};

impl Conv2dKernel for Cuda {
    fn conv2d_fwd(
        &self,
        g: &Conv2dGeom,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, params, at, y)?;
        check_i32("conv2d", &[x.len(), y.len(), g.weight_len()])?;
        if y.is_empty() {
            return Ok(());
        }
        let pixels = g.batch * g.out_h() * g.out_w();
        let plan = GemmPlan::new("conv2d", g.out_channels, pixels, g.patch_len())?;
        let w = view("conv2d", params, at.weight.clone())?;
        let b = view("conv2d", params, at.bias.clone())?;
        let ops = GemmOperands {
            a: &x.as_view(),
            b: &w,
            bias: Some(&b),
        };
        self.gemm(&FWD, &plan, *g, &ops, &mut y.as_view_mut())
    }

    fn conv2d_bwd(
        &self,
        g: &Conv2dGeom,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        dy: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        g.check_bwd::<Self>(x, params, at, dy, grads, dx.as_deref())?;
        check_i32("conv2d", &[x.len(), dy.len(), g.weight_len()])?;
        self.conv2d_bwd_weight(g, x, dy, grads, at)?;
        let mut db = view_mut("conv2d", grads, at.bias.clone())?;
        let per_channel = LaunchConfig {
            grid_dim: (g.out_channels as u32, 1, 1),
            block_dim: (BIAS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        self.kernel("conv2d_bwd_bias_f32")?
            .arg(dy)
            .arg(&mut db)
            .arg(g)
            .launch(per_channel)?;
        match dx {
            Some(dx) if !dx.is_empty() => {
                let w = view("conv2d", params, at.weight.clone())?;
                self.conv2d_bwd_input(g, dy, &w, dx)
            }
            _ => Ok(()),
        }
    }
}

impl Cuda {
    /// dW = dy · im2col(x)ᵀ: M = O, N = C·K·K, K = every output pixel of the
    /// batch, so it is usually split.
    fn conv2d_bwd_weight(
        &self,
        g: &Conv2dGeom,
        x: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        at: &ParamAt,
    ) -> Result<()> {
        let pixels = g.batch * g.out_h() * g.out_w();
        let plan = GemmPlan::new("conv2d", g.out_channels, g.patch_len(), pixels)?;
        let mut dw = view_mut("conv2d", grads, at.weight.clone())?;
        let ops = GemmOperands {
            a: &x.as_view(),
            b: &dy.as_view(),
            bias: None,
        };
        self.gemm(&BWD_WEIGHT, &plan, *g, &ops, &mut dw)
    }

    /// dx = Wᵀ · taps(dy): M = C, N = every input pixel of the batch,
    /// K = O·K·K.
    fn conv2d_bwd_input(
        &self,
        g: &Conv2dGeom,
        dy: &CudaSlice<f32>,
        w: &CudaView<'_, f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let pixels = g.batch * g.in_h * g.in_w;
        let taps = g.out_channels * g.kernel * g.kernel;
        let plan = GemmPlan::new("conv2d", g.in_channels, pixels, taps)?;
        let ops = GemmOperands {
            a: &dy.as_view(),
            b: w,
            bias: None,
        };
        self.gemm(&BWD_INPUT, &plan, *g, &ops, &mut dx.as_view_mut())
    }
}
