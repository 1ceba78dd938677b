use cudarc::driver::{CudaSlice, CudaViewMut};

use super::{LinearGeom, LinearKernel};
use crate::backend::cuda::gemm::{BiasGemmKernels, GemmKernels};
use crate::backend::cuda::kernels;
use crate::backend::cuda::launch::blocks_for;
use crate::backend::cuda::layer::{GemmLayer, Shape, gemm_layer_kernel};
use crate::ops::{LayerLens, ParamAt};
use crate::{Cuda, Result};

/// Threads per block of `linear_bwd_bias_f32` (one per output feature).
const BIAS_THREADS: u32 = 256;

impl GemmLayer for LinearGeom {
    const FWD: BiasGemmKernels<Self> = BiasGemmKernels {
        whole: kernels::linear_fwd,
        partial: kernels::linear_fwd_partial,
        reduce: kernels::linear_fwd_reduce_f32,
    };
    const BWD_WEIGHT: GemmKernels<Self> = GemmKernels {
        whole: kernels::linear_bwd_weight,
        partial: kernels::linear_bwd_weight_partial,
        reduce: kernels::linear_bwd_weight_reduce_f32,
    };
    const BWD_INPUT: GemmKernels<Self> = GemmKernels {
        whole: kernels::linear_bwd_input,
        partial: kernels::linear_bwd_input_partial,
        reduce: kernels::linear_bwd_input_reduce_f32,
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
        unsafe { kernels::linear_bwd_bias_f32(cuda, cfg, dy, db, self) }
    }
}

gemm_layer_kernel!(LinearKernel for LinearGeom: linear_fwd, linear_bwd);
