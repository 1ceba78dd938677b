// 2x2 max-pooling with stride 2 (odd trailing rows/columns dropped). The
// window rules are maxpool2d/cpu.rs's `window_max` and `window_argmax`: the
// maximum, NaN when any input is NaN, and the gradient to the first input
// equal to it in row-major window order (the first NaN for NaN).

// Mirrors `PoolGeom` (usize fields) field by field.
struct PoolGeom {
    unsigned long long batch, channels, in_h, in_w;
};

// f32::NAN, the CPU kernel's NaN, so outputs match bit for bit.
__device__ __forceinline__ float canonical_nan() { return __int_as_float(0x7fc00000); }

__device__ __forceinline__ float window_max(const float (&w)[4]) {
    const float m = fmaxf(fmaxf(w[0], w[1]), fmaxf(w[2], w[3]));
    const bool any_nan = isnan(w[0]) || isnan(w[1]) || isnan(w[2]) || isnan(w[3]);
    return any_nan ? canonical_nan() : m;
}

__device__ __forceinline__ int window_argmax(const float (&w)[4]) {
    const float m = window_max(w);
    for (int i = 0; i < 4; ++i) {
        if (w[i] == m || (isnan(m) && isnan(w[i]))) return i;
    }
    return 0;
}

// The window of output (plane, oh, ow), row-major.
__device__ __forceinline__ void load_window(const float* x, int in_h_w, int in_w,
                                            long long plane, int oh, int ow, float (&w)[4]) {
    const float* top = x + plane * in_h_w + (2 * oh) * in_w + 2 * ow;
    w[0] = top[0];
    w[1] = top[1];
    w[2] = top[in_w];
    w[3] = top[in_w + 1];
}

// One thread per output element.
extern "C" __global__ void maxpool2d_fwd_f32(const float* x, float* y, PoolGeom g) {
    const int in_h = (int)g.in_h, in_w = (int)g.in_w, oh_n = in_h / 2, ow_n = in_w / 2;
    const long long total = (long long)g.batch * (long long)g.channels * oh_n * ow_n;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long plane = i / (oh_n * ow_n);
    const int r = (int)(i - plane * (oh_n * ow_n));
    float w[4];
    load_window(x, in_h * in_w, in_w, plane, r / ow_n, r % ow_n, w);
    y[i] = window_max(w);
}

// One thread per input element: it receives its window's gradient when it
// is the window's argmax, zero otherwise (and in a dropped row or column),
// so dx is overwritten completely without a separate clearing pass.
extern "C" __global__ void maxpool2d_bwd_f32(const float* x, const float* dy, float* dx,
                                             PoolGeom g) {
    const int in_h = (int)g.in_h, in_w = (int)g.in_w, oh_n = in_h / 2, ow_n = in_w / 2;
    const long long total = (long long)g.batch * (long long)g.channels * in_h * in_w;
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const long long plane = i / (in_h * in_w);
    const int r = (int)(i - plane * (in_h * in_w));
    const int ih = r / in_w, iw = r % in_w;
    const int oh = ih / 2, ow = iw / 2;
    if (oh >= oh_n || ow >= ow_n) {
        dx[i] = 0.0f;
        return;
    }
    float w[4];
    load_window(x, in_h * in_w, in_w, plane, oh, ow, w);
    const int mine = (ih % 2) * 2 + iw % 2;
    dx[i] = window_argmax(w) == mine ? dy[plane * (oh_n * ow_n) + oh * ow_n + ow] : 0.0f;
}
