// The linear layer (with its bias), then ReLU and inverted dropout, in the
// product's store: linear.cu's forward product, each output written once
// through relu.cu's ReLU and dropout instead of written, read back and
// written again by relu_fwd_f32. A split K (fc1's: K = 9216) fills the
// workspace with linear.cu's `_partial` kernels and stores through the
// same epilogue in `linear_relu_fwd_reduce_f32`. The sums and the bias
// addition are linear.cu's and the epilogue is relu.cu's, with the element
// index b·O + o that relu_fwd_f32 gives the same value, so the bits are
// those of linear_fwd then relu_fwd.

#include "sgemm.cuh"
#include "linear/linear.cuh"
#include "dropout/dropout.cuh"

// y[b, o] = dropout(max(acc + bias[o], 0)) at element b·O + o.
struct BiasReluDropoutStore {
    float* y;
    const float* bias;
    int ld;
    DropoutArgs d;
    __device__ void operator()(int m, int n, float v) const {
        const int i = m * ld + n;
        const float s = v + bias[n];
        y[i] = dropout_apply(d, (unsigned long long)i, s < 0.0f ? 0.0f : s);
    }
};

// The wide float32 register kernel capped at 147 as linear_fwd's (ptxas's
// own choice: 159; GEMM_ENTRY_BOUNDS, sgemm.cuh).
#define LINEAR_RELU_FWD(NAME, KIND)                                                         \
    GEMM_ENTRY_BOUNDS(KIND, ANY, ANY, ANY, ANY, ANY,                                        \
                      REGS(147), ANY, ANY, ANY)                                             \
    NAME(const float* x, const float* w, const float* bias, float* y, LinearLaunch p,       \
                    DropoutArgs d) {                                                        \
        linear_fwd<KIND>(x, w, p, BiasReluDropoutStore{y, bias, (int)p.g.out_features, d}); \
    }
GEMM_VARIANTS(linear_relu_fwd, LINEAR_RELU_FWD)

// The split-K store: linear_fwd_reduce_f32's sums, through the epilogue.
extern "C" __global__ void linear_relu_fwd_reduce_f32(const float* ws, const float* bias, float* y,
                                                      LinearLaunch p, DropoutArgs d) {
    const int O = (int)p.g.out_features;
    gemm_reduce(ws, (int)p.g.batch, O, (int)p.t.splits, BiasReluDropoutStore{y, bias, O, d});
}

// Backward: relu.cu's mask of dy by the forward output y (and the dropout),
// in place, and the bias gradient db[o] = Σ_b dy[b, o] of the masked dy in
// one pass, instead of relu_bwd_f32 writing the masked dy and
// linear_bwd_bias_f32 reading it back. A block owns 32 columns (a warp's
// width): its 8 warps mask BWD_ROWS rows at a time in parallel into shared
// memory, then warp 0 adds them to each column's sum in row order from
// 0.0f, linear_bwd_bias_f32's order, so db has its bits.
// Launched with BWD_THREADS (cuda.rs) threads and a block per 32 columns.
#define BWD_ROWS 64

extern "C" __global__ void __launch_bounds__(256)
    linear_relu_bwd_bias_f32(const float* y, float* dy, float* db, LinearGeom g, DropoutArgs d) {
    __shared__ float rows[BWD_ROWS][32];
    const int B = (int)g.batch, O = (int)g.out_features;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    const int o = blockIdx.x * 32 + lane;
    float sum = 0.0f;
    for (int r0 = 0; r0 < B; r0 += BWD_ROWS) {
        const int rows_here = B - r0 < BWD_ROWS ? B - r0 : BWD_ROWS;
        for (int r = warp; r < rows_here; r += warps) {
            float v = 0.0f;
            if (o < O) {
                const int i = (r0 + r) * O + o;
                v = y[i] > 0.0f ? dropout_apply(d, (unsigned long long)i, dy[i]) : 0.0f;
                dy[i] = v;
            }
            rows[r][lane] = v;
        }
        __syncthreads();
        if (warp == 0) {
            for (int r = 0; r < rows_here; ++r) sum += rows[r][lane];
        }
        __syncthreads();
    }
    if (warp == 0 && o < O) db[o] = sum;
}
