// The forward convolution's geometry, GEMM operands and store (conv2d.cu's
// forward product), shared by conv2d.cu, conv2d_pool.cu, which walks the
// same product's columns in pooling-window order, and conv2d_relu.cu, which
// stores it through ReLU. Include sgemm.cuh first.

// Mirrors `Conv2dGeom` (usize fields) field by field.
struct Conv2dGeom {
    unsigned long long batch, in_channels, in_h, in_w, out_channels, kernel, stride, padding;
};

// Mirrors `GemmLaunch<Conv2dGeom>` in backend/cuda/gemm.rs.
struct Conv2dLaunch {
    Conv2dGeom g;
    GemmTiling t;
};

// The geometry in 32-bit ints (the host checks that every buffer fits), with
// the derived sizes the index arithmetic needs.
struct Dims {
    int n, c, h, w, o, k, s, pad, oh, ow, ohw, kk, ckk;
};

__device__ __forceinline__ Dims dims(const Conv2dGeom& g) {
    Dims d;
    d.n = (int)g.batch;
    d.c = (int)g.in_channels;
    d.h = (int)g.in_h;
    d.w = (int)g.in_w;
    d.o = (int)g.out_channels;
    d.k = (int)g.kernel;
    d.s = (int)g.stride;
    d.pad = (int)g.padding;
    d.oh = (d.h + 2 * d.pad - d.k) / d.s + 1;
    d.ow = (d.w + 2 * d.pad - d.k) / d.s + 1;
    d.ohw = d.oh * d.ow;
    d.kk = d.k * d.k;
    d.ckk = d.c * d.kk;
    return d;
}

// One column of im2col(x): an output pixel of one image, as the offset of
// its window's top-left corner in x (which may lie in the padding) and that
// corner's coordinates.
struct Window {
    int base, ih, iw;
};

// One row of im2col(x): a tap (c, kh, kw) of the kernel, as its offset
// from a window's corner and its place in the window.
struct Tap {
    int off, kh, kw;
};

__device__ __forceinline__ Window window_at(const Dims& d, int col) {
    const int img = col / d.ohw, p = col - img * d.ohw;
    const int oh = p / d.ow, ow = p - oh * d.ow;
    const int ih = oh * d.s - d.pad, iw = ow * d.s - d.pad;
    return Window{(img * d.c * d.h + ih) * d.w + iw, ih, iw};
}

__device__ __forceinline__ Tap tap_at(const Dims& d, int row) {
    const int c = row / d.kk, r = row - c * d.kk;
    const int kh = r / d.k, kw = r - kh * d.k;
    return Tap{(c * d.h + kh) * d.w + kw, kh, kw};
}

// im2col(x) at (window, tap); not there in the padding.
__device__ __forceinline__ GemmElem im2col_at(const float* x, const Dims& d, const Window& win,
                                              const Tap& tap) {
    const int ih = win.ih + tap.kh, iw = win.iw + tap.kw;
    const bool there = (unsigned)ih < (unsigned)d.h && (unsigned)iw < (unsigned)d.w;
    return GemmElem{x, win.base + tap.off, there};
}

// Forward B operand, B(k = row, n = col): walks output pixels.
struct Im2col {
    static const bool K_TABLE = true;
    static const bool K_FAST = false;
    typedef Window Mn;
    typedef Tap K;
    const float* x;
    Dims d;
    __device__ Window mn_part(int n) const { return window_at(d, n); }
    __device__ Tap k_part(int k) const { return tap_at(d, k); }
    __device__ GemmElem at(const Window& w, const Tap& t) const { return im2col_at(x, d, w, t); }
};

// Weight-grad B operand, B(k = col, n = row): the transpose, walking pixels as k.
struct Im2colT {
    static const bool K_TABLE = true;
    static const bool K_FAST = true;
    typedef Tap Mn;
    typedef Window K;
    const float* x;
    Dims d;
    __device__ Tap mn_part(int n) const { return tap_at(d, n); }
    __device__ Window k_part(int k) const { return window_at(d, k); }
    __device__ GemmElem at(const Tap& t, const Window& w) const { return im2col_at(x, d, w, t); }
};

// W [O, C·K·K] as A(o, row).
struct WeightRows : Offsets {
    static const bool K_FAST = true;
    typedef int Mn;
    typedef int K;
    int ckk;
    __device__ int mn_part(int m) const { return m * ckk; }
    __device__ int k_part(int k) const { return k; }
};

// C(m = channel, n = (image, pixel)) stored into an NCHW tensor with `planes`
// channels of `plane` pixels, plus bias[m] when there is one, then with
// RELU relu.cu's ReLU (`v < 0 ? 0 : v`: NaN and -0 pass).
template <bool RELU>
struct NchwStoreThen {
    float* out;
    const float* bias;
    int planes, plane;
    __device__ void operator()(int m, int n, float v) const {
        const int img = n / plane, p = n - img * plane;
        const float r = bias ? v + bias[m] : v;
        out[(img * planes + m) * plane + p] = RELU && r < 0.0f ? 0.0f : r;
    }
};
typedef NchwStoreThen<false> NchwStore;
