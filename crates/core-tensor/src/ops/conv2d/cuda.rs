use cudarc::driver::{CudaSlice, CudaViewMut, LaunchConfig};

use super::{Conv2dGeom, Conv2dKernel};
use crate::backend::cuda::gemm::{BiasGemmKernels, ByKind, GemmKernels};
use crate::backend::cuda::kernels;
use crate::backend::cuda::layer::{GemmLayer, Shape, gemm_layer_kernel};
use crate::ops::{LayerLens, ParamAt};
use crate::{Cuda, Result};

/// Threads of `conv2d_bwd_bias_f32` (REDUCE_THREADS in reduce.cuh).
const BIAS_THREADS: u32 = 256;

impl GemmLayer for Conv2dGeom {
    const FWD: BiasGemmKernels<Self> = BiasGemmKernels {
        whole: ByKind {
            fp32: kernels::conv2d_fwd_f32,
            fp32_wide: kernels::conv2d_fwd_f32w,
            tf32: kernels::conv2d_fwd_tf32,
        },
        partial: ByKind {
            fp32: kernels::conv2d_fwd_partial_f32,
            fp32_wide: kernels::conv2d_fwd_partial_f32w,
            tf32: kernels::conv2d_fwd_partial_tf32,
        },
        reduce: kernels::conv2d_fwd_reduce_f32,
    };
    const BWD_WEIGHT: GemmKernels<Self> = GemmKernels {
        whole: ByKind {
            fp32: kernels::conv2d_bwd_weight_f32,
            fp32_wide: kernels::conv2d_bwd_weight_f32w,
            tf32: kernels::conv2d_bwd_weight_tf32,
        },
        partial: ByKind {
            fp32: kernels::conv2d_bwd_weight_partial_f32,
            fp32_wide: kernels::conv2d_bwd_weight_partial_f32w,
            tf32: kernels::conv2d_bwd_weight_partial_tf32,
        },
        reduce: kernels::conv2d_bwd_weight_reduce_f32,
    };
    const BWD_INPUT: GemmKernels<Self> = GemmKernels {
        whole: ByKind {
            fp32: kernels::conv2d_bwd_input_f32,
            fp32_wide: kernels::conv2d_bwd_input_f32w,
            tf32: kernels::conv2d_bwd_input_tf32,
        },
        partial: ByKind {
            fp32: kernels::conv2d_bwd_input_partial_f32,
            fp32_wide: kernels::conv2d_bwd_input_partial_f32w,
            tf32: kernels::conv2d_bwd_input_partial_tf32,
        },
        reduce: kernels::conv2d_bwd_input_reduce_f32,
    };

    fn lens(&self) -> Result<LayerLens> {
        Conv2dGeom::lens(self)
    }

    /// Forward: M = O, N = every output pixel of the batch, K = C·K·K.
    /// dW = dy · im2col(x)ᵀ: M = O, N = C·K·K, K = every output pixel, so it
    /// is usually split. dx = Wᵀ · taps(dy): M = C, N = every input pixel,
    /// K = O·K·K.
    fn shapes(&self) -> [Shape; 3] {
        let out_pixels = self.batch * self.out_h() * self.out_w();
        let in_pixels = self.batch * self.in_h * self.in_w;
        let taps = self.out_channels * self.kernel * self.kernel;
        [
            (self.out_channels, out_pixels, self.patch_len()),
            (self.out_channels, self.patch_len(), out_pixels),
            (self.in_channels, in_pixels, taps),
        ]
    }

    unsafe fn bias_grad(
        &self,
        cuda: &Cuda,
        dy: &CudaSlice<f32>,
        db: &mut CudaViewMut<'_, f32>,
    ) -> Result<()> {
        let per_channel = LaunchConfig {
            grid_dim: (self.out_channels as u32, 1, 1),
            block_dim: (BIAS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller checked `dy` and `db` against the geometry;
        // one block per output channel, of the threads the kernel reduces
        // with.
        unsafe { kernels::conv2d_bwd_bias_f32(cuda, per_channel, dy, db, self) }
    }
}

gemm_layer_kernel!(Conv2dKernel for Conv2dGeom: conv2d_fwd, conv2d_bwd);
