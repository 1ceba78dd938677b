// One 2x2 max-pooling window (stride 2, odd trailing rows/columns
// dropped), shared by maxpool2d.cu and conv2d_pool.cu. The window rules are
// maxpool2d/cpu.rs's `window_max` and `window_route`: the maximum, NaN when
// any input is NaN, and the gradient to the first input equal to it in
// row-major window order (the first NaN for NaN). The epilogue (`Epilogue`
// in maxpool2d/mod.rs: ReLU when `relu` is 1, then the dropout) is relu.cu's,
// applied to each pooled value and, backward, to its gradient. Include
// dropout.cuh first.

// Mirrors `PoolGeom` (usize fields) field by field.
struct PoolGeom {
    unsigned long long batch, channels, in_h, in_w;
};

// f32::NAN, the CPU kernel's NaN: a pooled NaN is the same bits on both
// devices (fmaxf would drop a NaN; one the epilogue scales is CUDA's NaN,
// which the parity suite's NaN rule accepts).
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

// The pooled value m of output i after the epilogue.
__device__ __forceinline__ float pooled_fwd(unsigned int relu, const DropoutArgs& d, int i,
                                           float m) {
    return relu ? dropout_apply(d, i, m < 0.0f ? 0.0f : m) : m;
}

// The gradient of output i through the epilogue, which masks by the
// forward output y[i] (not read without ReLU).
__device__ __forceinline__ float pooled_bwd(unsigned int relu, const DropoutArgs& d, int i,
                                            const float* y, float dy) {
    return !relu ? dy : y[i] > 0.0f ? dropout_apply(d, i, dy) : 0.0f;
}

// Writes window (oh, ow)'s gradient, which starts at dx[top], to its input
// `arg` (0-3, row-major) and zero to the other three; the last window of a
// row or column also zeroes the odd column or row dropped beside it, so that
// a thread per window overwrites dx completely.
__device__ __forceinline__ void route_window(float* dx, int top, int in_h, int in_w, int oh,
                                             int ow, int arg, float grad) {
    dx[top] = arg == 0 ? grad : 0.0f;
    dx[top + 1] = arg == 1 ? grad : 0.0f;
    dx[top + in_w] = arg == 2 ? grad : 0.0f;
    dx[top + in_w + 1] = arg == 3 ? grad : 0.0f;
    const bool last_col = (in_w & 1) && ow == in_w / 2 - 1;
    const bool last_row = (in_h & 1) && oh == in_h / 2 - 1;
    if (last_col) {
        dx[top + 2] = 0.0f;
        dx[top + in_w + 2] = 0.0f;
    }
    if (last_row) {
        dx[top + 2 * in_w] = 0.0f;
        dx[top + 2 * in_w + 1] = 0.0f;
        if (last_col) dx[top + 2 * in_w + 2] = 0.0f;
    }
}

// The window of output (plane, oh, ow), row-major, and where it starts.
__device__ __forceinline__ int load_window(const float* x, int in_h_w, int in_w, int plane,
                                           int oh, int ow, float (&w)[4]) {
    const int top = plane * in_h_w + (2 * oh) * in_w + 2 * ow;
    w[0] = x[top];
    w[1] = x[top + 1];
    w[2] = x[top + in_w];
    w[3] = x[top + in_w + 1];
    return top;
}
