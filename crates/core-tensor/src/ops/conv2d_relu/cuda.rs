use cudarc::driver::CudaSlice;

use crate::backend::cuda::gemm::Store;
use crate::backend::cuda::launch::kernel_table;
use crate::ops::conv2d::Conv2dLaunch;
use crate::ops::gemm_layer::{ForwardPlan, GemmLayer};
use crate::ops::{Conv2dGeom, Dropout, ParamAt, ReluKernel};
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
    let forward = cuda.plan_forward(Some("conv2d_relu"), g, x, params, at, y)?;
    let Some(ForwardPlan { plan, w, b }) = forward else {
        return Ok(());
    };
    if plan.is_split() {
        // A split K stores through the reduce kernel: the convolution's
        // kernels, then ReLU's.
        // SAFETY: the buffers were checked against the geometry
        // (`plan_forward`), and the plan is its forward product.
        unsafe { cuda.gemm(&plan, *g, x, &w, Store::Bias(&Conv2dGeom::FWD, &b), y)? };
        return cuda.relu_fwd(Dropout::OFF, y);
    }
    let (variant, args) = (plan.variant(cuda.products()), plan.args(*g));
    // SAFETY: `x`, `W`, `b` and `y` were checked against the geometry
    // (`plan_forward`), and the plan is its forward product, unsplit.
    unsafe { conv2d_relu_fwd(cuda, variant, plan.tiles(), x, &w, &b, y, &args) }
}
