use cudarc::driver::{CudaSlice, CudaView};

use super::{LinearGeom, LinearKernel};
use crate::backend::cuda::gemm::{GemmKernels, GemmOperands, GemmPlan, check_i32};
use crate::backend::cuda::launch::blocks_for;
use crate::backend::cuda::{view, view_mut};
use crate::ops::ParamAt;
use crate::{Cuda, Result};

/// Threads per block of `linear_bwd_bias_f32` (one per output feature).
const BIAS_THREADS: u32 = 256;

const FWD: GemmKernels = GemmKernels {
    whole: "linear_fwd_f32",
    partial: "linear_fwd_partial_f32",
    reduce: "linear_fwd_reduce_f32",
};
const BWD_WEIGHT: GemmKernels = GemmKernels {
    whole: "linear_bwd_weight_f32",
    partial: "linear_bwd_weight_partial_f32",
    reduce: "linear_bwd_weight_reduce_f32",
};
const BWD_INPUT: GemmKernels = GemmKernels {
    whole: "linear_bwd_input_f32",
    partial: "linear_bwd_input_partial_f32",
    reduce: "linear_bwd_input_reduce_f32",
};

impl LinearKernel for Cuda {
    fn linear_fwd(
        &self,
        g: &LinearGeom,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
    ) -> Result<()> {
        g.check::<Self>(x, params, at, y)?;
        check_i32("linear", &[x.len(), y.len(), at.weight.len()])?;
        if y.is_empty() {
            return Ok(());
        }
        let plan = GemmPlan::new("linear", g.batch, g.out_features, g.in_features)?;
        let w = view("linear", params, at.weight.clone())?;
        let b = view("linear", params, at.bias.clone())?;
        let ops = GemmOperands {
            a: &x.as_view(),
            b: &w,
            bias: Some(&b),
        };
        self.gemm(&FWD, &plan, *g, &ops, &mut y.as_view_mut())
    }

    fn linear_bwd(
        &self,
        g: &LinearGeom,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        dy: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Result<()> {
        g.check_bwd::<Self>(x, params, at, dy, grads, dx.as_deref())?;
        check_i32("linear", &[x.len(), dy.len(), at.weight.len()])?;
        if !at.weight.is_empty() {
            self.linear_bwd_weight(g, x, dy, grads, at)?;
        }
        if g.out_features > 0 {
            let mut db = view_mut("linear", grads, at.bias.clone())?;
            self.kernel("linear_bwd_bias_f32")?
                .arg(dy)
                .arg(&mut db)
                .arg(g)
                .launch(blocks_for("linear", g.out_features, BIAS_THREADS)?)?;
        }
        match dx {
            Some(dx) if !dx.is_empty() => {
                let w = view("linear", params, at.weight.clone())?;
                self.linear_bwd_input(g, dy, &w, dx)
            }
            _ => Ok(()),
        }
    }
}

impl Cuda {
    /// dW = dyᵀ · x: M = out, N = in, K = batch.
    fn linear_bwd_weight(
        &self,
        g: &LinearGeom,
        x: &CudaSlice<f32>,
        dy: &CudaSlice<f32>,
        grads: &mut CudaSlice<f32>,
        at: &ParamAt,
    ) -> Result<()> {
        let plan = GemmPlan::new("linear", g.out_features, g.in_features, g.batch)?;
        let mut dw = view_mut("linear", grads, at.weight.clone())?;
        let ops = GemmOperands {
            a: &x.as_view(),
            b: &dy.as_view(),
            bias: None,
        };
        self.gemm(&BWD_WEIGHT, &plan, *g, &ops, &mut dw)
    }

    /// dx = dy · W: M = batch, N = in, K = out.
    fn linear_bwd_input(
        &self,
        g: &LinearGeom,
        dy: &CudaSlice<f32>,
        w: &CudaView<'_, f32>,
        dx: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let plan = GemmPlan::new("linear", g.batch, g.in_features, g.out_features)?;
        let ops = GemmOperands {
            a: &dy.as_view(),
            b: w,
            bias: None,
        };
        self.gemm(&BWD_INPUT, &plan, *g, &ops, &mut dx.as_view_mut())
    }
}
