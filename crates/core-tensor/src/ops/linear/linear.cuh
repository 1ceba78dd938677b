// The linear layer's geometry, operands and forward product (linear.cu's),
// shared by linear.cu and linear_relu.cu, which stores the same product
// through ReLU and dropout. Include sgemm.cuh first.

// Mirrors `LinearGeom` (usize fields) field by field.
struct LinearGeom {
    unsigned long long batch, in_features, out_features;
};

// Mirrors `GemmLaunch<LinearGeom>` in backend/cuda/gemm.rs.
struct LinearLaunch {
    LinearGeom g;
    GemmTiling t;
};

// A row-major matrix read as (mn, k): element [mn · ld + k].
struct RowsByK : Offsets {
    static const bool K_FAST = true;
    typedef int Mn;
    typedef int K;
    int ld;
    __device__ int mn_part(int mn) const { return mn * ld; }
    __device__ int k_part(int k) const { return k; }
};

// A row-major matrix read transposed, as (mn, k): element [k · ld + mn].
struct ColsByK : Offsets {
    static const bool K_FAST = false;
    typedef int Mn;
    typedef int K;
    int ld;
    __device__ int mn_part(int mn) const { return mn; }
    __device__ int k_part(int k) const { return k * ld; }
};

// y[b, o] = acc + bias[o].
struct BiasStore {
    float* y;
    const float* bias;
    int ld;
    __device__ void operator()(int m, int n, float v) const { y[m * ld + n] = v + bias[n]; }
};

// Forward: M = batch, N = out, K = in; A = x, B(k = i, n = o) = W[o, i].
template <class KIND, class S>
__device__ __forceinline__ void linear_fwd(const float* x, const float* w, const LinearLaunch& p,
                                           const S& store) {
    const int I = (int)p.g.in_features, O = (int)p.g.out_features;
    gemm<KIND>(RowsByK{x, I}, RowsByK{w, I}, (int)p.g.batch, O, I, p.t, store);
}
