// conv2d (with its bias) then ReLU, in the product's store: conv2d.cu's
// forward product, each output written once through relu.cu's ReLU instead
// of written, read back and written again by relu_fwd_f32. The sums are
// conv2d.cu's and the ReLU is the same comparison, so the bits are those of
// conv2d_fwd then relu_fwd. A split K takes those two kernels (the host).

#include "sgemm.cuh"
#include "conv2d/conv2d.cuh"

template <class KIND>
__device__ __forceinline__ void conv2d_relu_fwd(const float* x, const float* w, const float* bias,
                                                float* y, const Conv2dLaunch& p) {
    const Dims d = dims(p.g);
    gemm<KIND>(WeightRows{w, d.ckk}, Im2col{x, d}, d.o, d.n * d.ohw, d.ckk, p.t,
               NchwStoreThen<true>{y, bias, d.o, d.ohw});
}

#define CONV2D_RELU_FWD(NAME, KIND)                                                           \
    GEMM_ENTRY NAME(const float* x, const float* w, const float* bias, float* y, Conv2dLaunch p) { \
        conv2d_relu_fwd<KIND>(x, w, bias, y, p);                                              \
    }
GEMM_VARIANTS(conv2d_relu_fwd, CONV2D_RELU_FWD)
