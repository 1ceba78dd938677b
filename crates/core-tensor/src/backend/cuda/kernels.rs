//! The kernel table: one module per `src/ops/<op>/<op>.cu`, and each entry
//! point its `cuda.rs` launches with its parameters, declared once. From it
//! `kernel_table!` (launch.rs) makes [`kernel_modules`] and one typed
//! launcher per kernel, e.g. `kernels::relu_fwd_f32(cuda, cfg, x, &n)`.
//! [`super::Cuda::new`] loads every module, so a name missing from a module
//! fails there, not mid-training; the tests below check each declaration
//! against the source, and the NVRTC test each name against the PTX.

mod ptx {
    include!(concat!(env!("OUT_DIR"), "/ptx.rs"));
}

use cudarc::driver::LaunchConfig;

use super::Cuda;
use super::launch::{DropoutArgs, GatherArgs, GemmLaunch, In, Out, Val, kernel_table};
use crate::Result;
use crate::ops::{
    AdamScalars, ClassGeom, Conv2dGeom, EmbeddingGeom, LinearGeom, MseGeom, OffsetGeom, PoolGeom,
    RowsGeom, SparseAdamScalars,
};

/// The launch parameters of the conv2d GEMM kernels (`Conv2dLaunch` in C).
pub(crate) type Conv2dLaunch = GemmLaunch<Conv2dGeom>;
/// The launch parameters of the linear GEMM kernels (`LinearLaunch` in C).
pub(crate) type LinearLaunch = GemmLaunch<LinearGeom>;

/// The virtual architecture of the PTX embedded by build.rs, if nvcc ran.
pub(super) const PTX_ARCH: Option<&str> = ptx::PTX_ARCH;

/// One `.cu` file, compiled as a unit.
#[derive(Debug)]
pub struct KernelModule {
    /// The op, e.g. `conv2d`.
    pub name: &'static str,
    /// The CUDA C++ source, its `#include`s pasted in by build.rs.
    pub source: &'static str,
    /// PTX that nvcc built from `source` at build time, if it was found.
    pub ptx: Option<&'static str>,
    /// The `extern "C"` kernels the op launches.
    pub functions: &'static [&'static str],
}

kernel_table! {
    accumulate (ACCUMULATE_SRC, ACCUMULATE_PTX) {
        accumulate_f32(
            grads: Out<f32>,
            acc: Out<f32>,
            weight: Val<f32>,
            into_grads: Val<u32>,
            start: Val<u64>,
            end: Val<u64>,
        );
    }
    accuracy (ACCURACY_SRC, ACCURACY_PTX) {
        count_correct_f32(logits: In<f32>, labels: In<u8>, correct: Out<f32>, g: Val<ClassGeom>);
    }
    adam (ADAM_SRC, ADAM_PTX) {
        adam_step_f32(
            params: Out<f32>,
            grads: In<f32>,
            m: Out<f32>,
            v: Out<f32>,
            guard: In<u32>,
            s: Val<AdamScalars>,
            start: Val<u64>,
            end: Val<u64>,
        );
        sparse_adam_step_f32(
            params: Out<f32>,
            grads: In<f32>,
            m: Out<f32>,
            v: Out<f32>,
            ids: In<u32>,
            guard: In<u32>,
            fault: Out<u32>,
            s: Val<SparseAdamScalars>,
            g: Val<RowsGeom>,
        );
    }
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
    conv2d_relu (CONV2D_RELU_SRC, CONV2D_RELU_PTX) {
    } [
        GEMM_VARIANTS conv2d_relu_fwd(x: In<f32>, w: In<f32>, bias: In<f32>, y: Out<f32>, p: Val<Conv2dLaunch>);
    ]
    cross_entropy (CROSS_ENTROPY_SRC, CROSS_ENTROPY_PTX) {
        cross_entropy_fwd_bwd_f32(
            logits: In<f32>,
            labels: In<u8>,
            dlogits: Out<f32>,
            loss_sum: Out<f32>,
            fault: Out<u32>,
            g: Val<ClassGeom>,
        );
    }
    embedding (EMBEDDING_SRC, EMBEDDING_PTX) {
        embedding_fwd_f32(ids: In<u32>, params: In<f32>, out: Out<f32>, fault: Out<u32>, g: Val<EmbeddingGeom>);
        embedding_bwd_zero_f32(grads: Out<f32>, g: Val<EmbeddingGeom>);
        embedding_bwd_f32(ids: In<u32>, dout: In<f32>, grads: Out<f32>, fault: Out<u32>, g: Val<EmbeddingGeom>);
    }
    finite (FINITE_SRC, FINITE_PTX) {
        guard_finite_f32(
            values: In<f32>,
            loss: In<f32>,
            guard: Out<u32>,
            step: Val<u32>,
            start: Val<u64>,
            end: Val<u64>,
        );
        guard_finite_rows_f32(
            values: In<f32>,
            ids: In<u32>,
            guard: Out<u32>,
            fault: Out<u32>,
            step: Val<u32>,
            g: Val<RowsGeom>,
        );
    }
    gather (GATHER_SRC, GATHER_PTX) {
        gather_batch_u8_f32(
            images: In<u8>,
            labels: In<u8>,
            indices: In<u32>,
            x: Out<f32>,
            y: Out<u8>,
            fault: Out<u32>,
            a: Val<GatherArgs>,
        );
    }
    half_cast (HALF_CAST_SRC, HALF_CAST_PTX) {
        to_half_f32(src: In<f32>, dst: Out<u16>, format: Val<u32>, start: Val<u64>, end: Val<u64>);
        from_half_f32(src: In<u16>, dst: Out<f32>, format: Val<u32>, start: Val<u64>, end: Val<u64>);
    }
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
    maxpool2d (MAXPOOL2D_SRC, MAXPOOL2D_PTX) {
        maxpool2d_fwd_f32(x: In<f32>, y: Out<f32>, g: Val<PoolGeom>, relu: Val<u32>, d: Val<DropoutArgs>);
        maxpool2d_bwd_f32(
            x: In<f32>,
            y: In<f32>,
            dy: In<f32>,
            dx: Out<f32>,
            g: Val<PoolGeom>,
            relu: Val<u32>,
            d: Val<DropoutArgs>,
        );
    }
    mse (MSE_SRC, MSE_PTX) {
        mse_fwd_bwd_f32(y: In<f32>, target: In<f32>, dy: Out<f32>, loss_sum: Out<f32>, g: Val<MseGeom>);
        mse_fwd_f32(y: In<f32>, target: In<f32>, loss_sum: Out<f32>, g: Val<MseGeom>);
    }
    offset (OFFSET_SRC, OFFSET_PTX) {
        offset_fwd_f32(offsets: In<f32>, y: Out<f32>, g: Val<OffsetGeom>);
        offset_bwd_f32(dy: In<f32>, d_offsets: Out<f32>, g: Val<OffsetGeom>);
    }
    relu (RELU_SRC, RELU_PTX) {
        relu_fwd_f32(x: Out<f32>, n: Val<u64>, d: Val<DropoutArgs>);
        relu_bwd_f32(y: In<f32>, dy: Out<f32>, n: Val<u64>, d: Val<DropoutArgs>);
    }
    rows (ROWS_SRC, ROWS_PTX) {
        rows_gather_f32(ids: In<u32>, flat: In<f32>, rows: Out<f32>, fault: Out<u32>, g: Val<RowsGeom>);
        rows_scatter_f32(ids: In<u32>, rows: In<f32>, flat: Out<f32>, fault: Out<u32>, g: Val<RowsGeom>);
    }
    sgd (SGD_SRC, SGD_PTX) {
        sgd_step_f32(params: Out<f32>, grads: In<f32>, guard: In<u32>, minus_lr: Val<f32>, n: Val<u64>);
    }
}

/// Every kernel module, in name order.
pub fn kernel_modules() -> &'static [KernelModule] {
    MODULES
}

#[cfg(test)]
use tests::CType;

#[cfg(test)]
#[path = "kernels_tests.rs"]
mod tests;
