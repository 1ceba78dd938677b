use cudarc::driver::CudaSlice;

use crate::backend::cuda::gemm::{GemmPlan, check_i32};
use crate::backend::cuda::launch::kernel_table;
use crate::backend::cuda::view;
use crate::ops::conv2d::Conv2dLaunch;
use crate::ops::{Conv2dGeom, Dropout, LayerKernel, ParamAt, ReluKernel};
use crate::{Cuda, Result};

kernel_table! {
    conv2d_relu (CONV2D_RELU_SRC, CONV2D_RELU_PTX) {
    } [
        GEMM_VARIANTS conv2d_relu_fwd(x: In<f32>, w: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<Conv2dLaunch>);
    ]
}

/// `y = max(conv(x, W) + b, 0)` in the product's store, on a GPU that
/// fuses (`GemmLayer::fused_relu_fwd`, without dropout).
pub(crate) fn conv2d_relu_fwd_fused(
    cuda: &Cuda,
    g: &Conv2dGeom,
    x: &CudaSlice<f32>,
    params: &CudaSlice<f32>,
    at: &ParamAt,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    let lens = g.lens()?;
    lens.check::<Cuda>(x, params, at, y)?;
    check_i32("conv2d_relu", &[x.len(), y.len(), lens.weight])?;
    if y.is_empty() {
        return Ok(());
    }
    let (m, n, k) = (g.out_channels, y.len() / g.out_channels, g.patch_len());
    let plan = GemmPlan::new("conv2d_relu", m, n, k, cuda.gemm_tile())?;
    if plan.is_split() {
        // A split K stores through the reduce kernel: the two kernels.
        cuda.layer_fwd(g, x, params, at, y)?;
        return cuda.relu_fwd(Dropout::OFF, y);
    }
    let w = view("conv2d_relu", params, at.weight.clone())?;
    let b = view("conv2d_relu", params, at.bias.clone())?;
    let (variant, args) = (plan.variant(cuda.products()), plan.args(*g));
    // SAFETY: `x`, `W`, `b` and `y` were checked against the geometry
    // (`lens.check`), and the plan is its forward product, unsplit.
    unsafe { conv2d_relu_fwd(cuda, variant, plan.tiles(), x, &w, &b, y, &args) }
}
