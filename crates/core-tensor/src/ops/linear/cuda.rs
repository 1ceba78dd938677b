use cudarc::driver::{CudaSlice, CudaViewMut, DeviceRepr};

use super::{LinearGeom, LinearLaunch};
use crate::backend::cuda::gemm::{BiasGemmKernels, GemmKernels};
use crate::backend::cuda::launch::blocks_for;
use crate::backend::cuda::launch::kernel_table;
use crate::ops::gemm_layer::{GemmLayer, Shape};
use crate::ops::linear_relu::cuda::{linear_relu_bwd_fused, linear_relu_fwd_fused};
use crate::ops::{Dropout, LayerLens, ParamAt};
use crate::{Cuda, Result};

// SAFETY: repr(C), three usize fields, mirrored by `LinearGeom` in linear.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for LinearGeom {}

kernel_table! {
    linear (LINEAR_SRC, LINEAR_PTX) {
        linear_fwd_reduce_f32(ws: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<LinearLaunch>);
        linear_bwd_weight_reduce_f32(ws: In<f32>, dw: Out<f32>, p: Val<LinearLaunch>);
        linear_bwd_input_reduce_f32(ws: In<f32>, dx: Out<f32>, p: Val<LinearLaunch>);
        linear_bwd_bias_f32(dy: In<f32>, db: Out<f32>, g: Val<LinearGeom>);
    } [
        GEMM_VARIANTS linear_fwd(x: In<f32>, w: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<LinearLaunch>);
        GEMM_VARIANTS linear_fwd_partial(x: In<f32>, w: In<f32>, ws: Out<f32>, p: Val<LinearLaunch>);
        GEMM_VARIANTS linear_bwd_weight(x: In<f32>, dy: In<f32>, dw: Out<f32>, p: Val<LinearLaunch>);
        GEMM_VARIANTS linear_bwd_weight_partial(x: In<f32>, dy: In<f32>, ws: Out<f32>, p: Val<LinearLaunch>);
        GEMM_VARIANTS linear_bwd_input(dy: In<f32>, w: In<f32>, dx: Out<f32>, p: Val<LinearLaunch>);
        GEMM_VARIANTS linear_bwd_input_partial(dy: In<f32>, w: In<f32>, ws: Out<f32>, p: Val<LinearLaunch>);
    ]
}

/// Threads per block of `linear_bwd_bias_f32` (one per output feature).
const BIAS_THREADS: u32 = 256;

impl GemmLayer for LinearGeom {
    const FWD: BiasGemmKernels<Self> = BiasGemmKernels {
        whole: linear_fwd,
        partial: linear_fwd_partial,
        reduce: linear_fwd_reduce_f32,
    };
    const BWD_WEIGHT: GemmKernels<Self> = GemmKernels {
        whole: linear_bwd_weight,
        partial: linear_bwd_weight_partial,
        reduce: linear_bwd_weight_reduce_f32,
    };
    const BWD_INPUT: GemmKernels<Self> = GemmKernels {
        whole: linear_bwd_input,
        partial: linear_bwd_input_partial,
        reduce: linear_bwd_input_reduce_f32,
    };

    fn lens(&self) -> Result<LayerLens> {
        Ok(LinearGeom::lens(self))
    }

    /// Forward: M = batch, N = out, K = in. dW = dyᵀ · x: M = out, N = in,
    /// K = batch. dx = dy · W: M = batch, N = in, K = out.
    fn shapes(&self) -> [Shape; 3] {
        let (batch, inputs, outputs) = (self.batch, self.in_features, self.out_features);
        [
            (batch, outputs, inputs),
            (outputs, inputs, batch),
            (batch, inputs, outputs),
        ]
    }

    unsafe fn bias_grad(
        &self,
        cuda: &Cuda,
        dy: &CudaSlice<f32>,
        db: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let cfg = blocks_for("linear", self.out_features, BIAS_THREADS)?;
        // SAFETY: the caller checked `dy` and `db` against the geometry;
        // one thread per output feature, each bounds-checked.
        unsafe { linear_bwd_bias_f32(cuda, cfg, dy, db, self) }
    }

    /// linear_relu's kernels.
    fn fused_relu_fwd(
        &self,
        cuda: &Cuda,
        dropout: Dropout,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
    ) -> Option<Result<()>> {
        Some(linear_relu_fwd_fused(cuda, self, dropout, x, params, at, y))
    }

    fn fused_relu_bwd(
        &self,
        cuda: &Cuda,
        dropout: Dropout,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        saved: (&CudaSlice<f32>, &mut CudaSlice<f32>),
        grads: &mut CudaSlice<f32>,
        dx: Option<&mut CudaSlice<f32>>,
    ) -> Option<Result<()>> {
        let fused = linear_relu_bwd_fused(cuda, self, dropout, x, params, at, saved, grads, dx);
        Some(fused)
    }
}
