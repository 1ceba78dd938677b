use cudarc::driver::{CudaSlice, CudaViewMut, DeviceRepr, LaunchConfig};

use super::{Conv2dGeom, Conv2dLaunch};
use crate::backend::cuda::gemm::{BiasGemmKernels, GemmKernels};
use crate::backend::cuda::launch::kernel_table;
use crate::ops::gemm_layer::{GemmLayer, Shape};
use crate::ops::{Dropout, LayerLens, ParamAt};
use crate::{Cuda, Result};

// SAFETY: repr(C), eight usize fields, mirrored by `Conv2dGeom` in conv2d.cu (`usize` is
// `unsigned long long`, asserted in launch.rs); passed by value, it holds
// no pointer.
unsafe impl DeviceRepr for Conv2dGeom {}

kernel_table! {
    conv2d (CONV2D_SRC, CONV2D_PTX) {
        conv2d_fwd_reduce_f32(ws: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<Conv2dLaunch>);
        conv2d_bwd_input_reduce_f32(ws: In<f32>, dx: Out<f32>, p: Val<Conv2dLaunch>);
        conv2d_bwd_weight_reduce_f32(ws: In<f32>, dw: Out<f32>, p: Val<Conv2dLaunch>);
        conv2d_bwd_bias_partial_f32(dy: In<f32>, ws: Out<f32>, g: Val<Conv2dGeom>);
        conv2d_bwd_bias_reduce_f32(ws: In<f32>, db: Out<f32>, g: Val<Conv2dGeom>);
    } [
        GEMM_VARIANTS conv2d_fwd(x: In<f32>, w: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<Conv2dLaunch>);
        GEMM_VARIANTS conv2d_fwd_partial(x: In<f32>, w: In<f32>, ws: Out<f32>, p: Val<Conv2dLaunch>);
        GEMM_VARIANTS conv2d_bwd_input(dy: In<f32>, w: In<f32>, dx: Out<f32>, p: Val<Conv2dLaunch>);
        GEMM_VARIANTS conv2d_bwd_input_partial(dy: In<f32>, w: In<f32>, ws: Out<f32>, p: Val<Conv2dLaunch>);
        GEMM_VARIANTS conv2d_bwd_weight(x: In<f32>, dy: In<f32>, dw: Out<f32>, p: Val<Conv2dLaunch>);
        GEMM_VARIANTS conv2d_bwd_weight_partial(x: In<f32>, dy: In<f32>, ws: Out<f32>, p: Val<Conv2dLaunch>);
    ]
}

/// Threads of `conv2d_bwd_bias_partial_f32` (REDUCE_THREADS in reduce.cuh)
/// and of `conv2d_bwd_bias_reduce_f32` (GEMM_THREADS in sgemm.cuh).
const BIAS_THREADS: u32 = 256;
/// Elements of a channel that one block of `conv2d_bwd_bias_partial_f32`
/// sums (BIAS_SLICE in conv2d.cu).
const BIAS_SLICE: usize = 4096;
/// Channels per block of `conv2d_bwd_bias_reduce_f32`: a warp each.
const BIAS_CHANNELS_PER_BLOCK: usize = BIAS_THREADS as usize / 32;

impl GemmLayer for Conv2dGeom {
    const FWD: BiasGemmKernels<Self> = BiasGemmKernels {
        whole: conv2d_fwd,
        partial: conv2d_fwd_partial,
        reduce: conv2d_fwd_reduce_f32,
    };
    const BWD_WEIGHT: GemmKernels<Self> = GemmKernels {
        whole: conv2d_bwd_weight,
        partial: conv2d_bwd_weight_partial,
        reduce: conv2d_bwd_weight_reduce_f32,
    };
    const BWD_INPUT: GemmKernels<Self> = GemmKernels {
        whole: conv2d_bwd_input,
        partial: conv2d_bwd_input_partial,
        reduce: conv2d_bwd_input_reduce_f32,
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
        let slices = self.bias_slices();
        let mut ws = cuda.scratch(slices * self.out_channels)?;
        let partial = LaunchConfig {
            // At most i32::MAX blocks: `layer_bwd` checked that dy's
            // O·N·OH·OW elements fit in an i32.
            grid_dim: ((slices * self.out_channels) as u32, 1, 1),
            block_dim: (BIAS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let reduce = LaunchConfig {
            grid_dim: (
                self.out_channels.div_ceil(BIAS_CHANNELS_PER_BLOCK) as u32,
                1,
                1,
            ),
            block_dim: (BIAS_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the caller checked `dy` and `db` against the geometry;
        // `ws` holds a partial sum per slice and channel, what the first
        // kernel writes (a block each) and the second reads (a warp per
        // channel), both of the threads they are written for.
        unsafe {
            conv2d_bwd_bias_partial_f32(cuda, partial, dy, &mut ws, self)?;
            conv2d_bwd_bias_reduce_f32(cuda, reduce, &ws, db, self)
        }
    }

    /// conv2d_relu's kernel, which has no dropout.
    fn fused_relu_fwd(
        &self,
        cuda: &Cuda,
        dropout: Dropout,
        x: &CudaSlice<f32>,
        params: &CudaSlice<f32>,
        at: &ParamAt,
        y: &mut CudaSlice<f32>,
    ) -> Option<Result<()>> {
        let fused = crate::ops::conv2d_relu::cuda::conv2d_relu_fwd_fused;
        dropout
            .is_off()
            .then(|| fused(cuda, self, x, params, at, y))
    }
}

impl Conv2dGeom {
    /// How many slices of [`BIAS_SLICE`] elements each channel's bias
    /// gradient is summed in (`bias_slices` in conv2d.cu); one for an empty
    /// batch, so that the gradient is still written (zero).
    fn bias_slices(&self) -> usize {
        (self.batch * self.out_h() * self.out_w())
            .div_ceil(BIAS_SLICE)
            .max(1)
    }
}
