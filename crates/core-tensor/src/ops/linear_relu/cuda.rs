use cudarc::driver::{CudaSlice, LaunchConfig};

use crate::backend::cuda::launch::{blocks_for, kernel_table};
use crate::backend::cuda::view_mut;
use crate::error::check_len;
use crate::ops::dropout::cuda::DropoutArgs;
use crate::ops::gemm_layer::{ForwardPlan, GemmLayer, check_bwd};
use crate::ops::linear::LinearLaunch;
use crate::ops::{Dropout, LinearGeom, ParamAt};
use crate::{Cuda, Result};

kernel_table! {
    linear_relu (LINEAR_RELU_SRC, LINEAR_RELU_PTX) {
        linear_relu_fwd_reduce_f32(
            ws: In<f32>,
            bias: In<f32>,
            y: Out<f32>,
            p: Val<LinearLaunch>,
            d: Val<DropoutArgs>,
        );
        linear_relu_bwd_bias_f32(
            y: In<f32>,
            dy: Out<f32>,
            db: Out<f32>,
            g: Val<LinearGeom>,
            d: Val<DropoutArgs>,
        );
    } [
        GEMM_VARIANTS linear_relu_fwd(x: In<f32>, w: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<LinearLaunch>, d: Val<DropoutArgs>);
    ]
}

/// Threads per block of `linear_relu_bwd_bias_f32`, and the columns each
/// block owns (a warp's width).
const BWD_THREADS: u32 = 256;
const BWD_COLUMNS: u32 = 32;

/// `y = dropout(max(x·Wᵀ + b, 0))` in the product's store (or the split
/// reduction's), on a GPU that fuses (`GemmLayer::fused_relu_fwd`).
pub(crate) fn linear_relu_fwd_fused(
    cuda: &Cuda,
    g: &LinearGeom,
    dropout: Dropout,
    x: &CudaSlice<f32>,
    params: &CudaSlice<f32>,
    at: &ParamAt,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let d = DropoutArgs::new(dropout)?;
    let forward = cuda.plan_forward(Some("linear_relu"), g, x, params, at, y)?;
    let Some(ForwardPlan { plan, w, b }) = forward else {
        return Ok(());
    };
    let variant = plan.variant(cuda.products());
    let args = plan.args(*g);
    if plan.is_split() {
        // linear.cu's partial products, then the reduction that stores
        // through the epilogue.
        let mut ws = cuda.scratch(plan.workspace_len())?;
        // SAFETY: `x`, `W`, `b` and `y` were checked against the
        // geometry (`plan_forward`), the plan is its forward product, and
        // `ws` holds the splits·m·n elements the partial kernel writes
        // and the reduce kernel reads.
        unsafe {
            (LinearGeom::FWD.partial)(cuda, variant, plan.tiles(), x, &w, &mut ws, &args)?;
            linear_relu_fwd_reduce_f32(cuda, plan.reduce(), &ws, &b, y, &args, &d)
        }
    } else {
        // SAFETY: as above; the plan is unsplit, so the tile kernel
        // stores the result.
        unsafe { linear_relu_fwd(cuda, variant, plan.tiles(), x, &w, &b, y, &args, &d) }
    }
}

/// The fused forward pass's backward: `dy` masked and `db` summed in one
/// pass, then the layer's two products (`GemmLayer::fused_relu_bwd`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear_relu_bwd_fused(
    cuda: &Cuda,
    g: &LinearGeom,
    dropout: Dropout,
    x: &CudaSlice<f32>,
    params: &CudaSlice<f32>,
    at: &ParamAt,
    (y, dy): (&CudaSlice<f32>, &mut CudaSlice<f32>),
    grads: &mut CudaSlice<f32>,
    dx: Option<&mut CudaSlice<f32>>,
) -> Result<()> {
    let d = DropoutArgs::new(dropout)?;
    check_len("linear_relu", "y", y.len(), dy.len())?;
    let lens = check_bwd(g, x, params, at, dy, grads, dx.as_deref())?;
    if lens.bias > 0 {
        let mut db = view_mut("linear_relu", grads, at.bias.clone())?;
        let cfg = LaunchConfig {
            block_dim: (BWD_THREADS, 1, 1),
            ..blocks_for("linear_relu", g.out_features, BWD_COLUMNS)?
        };
        // SAFETY: `y` and `dy` hold batch·out elements and `db` out
        // (`check_bwd`, `check_len`); each thread checks its column
        // against `out` and its rows against `batch`.
        unsafe { linear_relu_bwd_bias_f32(cuda, cfg, y, dy, &mut db, g, &d)? };
    }
    cuda.layer_bwd_products(g, x, params, at, dy, grads, dx)
}
