// The finiteness guard (finite/mod.rs), one thread per value checked.
// Integer atomics only: the index only decreases (atomicMin) and the step
// is set once (atomicCAS from 0), so whatever the order of the threads and
// of the step's launches, the guard ends with the step's smallest bad
// index, and the result is deterministic.

// Mirrors `RowsGeom` (usize fields) field by field.
struct RowsGeom {
    unsigned long long count, dim, rows, offset;
};

// Bit 3 of the backend's fault word (backend/cuda/fault.rs), as rows.cu:
// an id was not below the table's row count, or not above the one before it.
#define FAULT_ROWS 8u

// Whether this launch may still change the guard: clear, or tripped at this
// same step (by an earlier launch of the step, or another block of this
// one): go on, to find the smallest index. Tripped at an earlier step: keep
// that one. Launches on one stream run in order, so an earlier launch's
// atomics are seen here.
__device__ bool guard_open(const unsigned int* guard, unsigned int step) {
    const unsigned int seen = guard[0];
    return seen == 0u || seen == step;
}

__device__ void guard_trip(unsigned int* guard, unsigned int step, unsigned long long i) {
    atomicMin(&guard[1], (unsigned int)i);
    atomicCAS(&guard[0], 0u, step);
}

// The loss and `values[start..end]`.
extern "C" __global__ void guard_finite_f32(const float* values, const float* loss,
                                            unsigned int* guard, unsigned int step,
                                            unsigned long long start, unsigned long long end) {
    if (!guard_open(guard, step)) return;
    const unsigned long long k = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned long long i = start + k;
    if (i < end && !isfinite(values[i])) guard_trip(guard, step, i);
    if (k == 0 && !isfinite(loss[0])) atomicCAS(&guard[0], 0u, step);
}

// The rows `ids[0..count]` names of the table `g` places in `values`.
extern "C" __global__ void guard_finite_rows_f32(const float* values, const unsigned int* ids,
                                                 unsigned int* guard, unsigned int* fault,
                                                 unsigned int step, RowsGeom g) {
    if (!guard_open(guard, step)) return;
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.count * g.dim) return;
    const unsigned long long b = i / g.dim, d = i - b * g.dim;
    if (ids[b] >= g.rows || (b > 0 && ids[b - 1] >= ids[b])) {
        if (d == 0) atomicOr(fault, FAULT_ROWS);
        return;
    }
    const unsigned long long at = g.offset + ids[b] * g.dim + d;
    if (!isfinite(values[at])) guard_trip(guard, step, at);
}
