// Rows of a table inside a flat buffer, picked by increasing ids: one thread
// per value copies it out to the compact rows (gather) or back (scatter).
// Distinct ids make every scatter thread write its own element.

// Mirrors `RowsGeom` (usize fields) field by field.
struct RowsGeom {
    unsigned long long count, dim, rows, offset;
};

// Bit 3 of the backend's fault word (backend/cuda/fault.rs): an id was not
// below the table's row count, or not above the id before it.
#define FAULT_ROWS 8u

// Whether id `b` is below the row count and above the one before it; sets
// the fault bit (once per row) when not.
__device__ bool rows_id_ok(const unsigned int* ids, unsigned long long b,
                           unsigned long long d, unsigned int* fault, RowsGeom g) {
    const bool ok = ids[b] < g.rows && (b == 0 || ids[b - 1] < ids[b]);
    if (!ok && d == 0) atomicOr(fault, FAULT_ROWS);
    return ok;
}

extern "C" __global__ void rows_gather_f32(const unsigned int* ids, const float* flat,
                                           float* rows, unsigned int* fault, RowsGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.count * g.dim) return;
    const unsigned long long b = i / g.dim, d = i - b * g.dim;
    rows[i] = rows_id_ok(ids, b, d, fault, g) ? flat[g.offset + ids[b] * g.dim + d] : 0.0f;
}

extern "C" __global__ void rows_scatter_f32(const unsigned int* ids, const float* rows,
                                            float* flat, unsigned int* fault, RowsGeom g) {
    const unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= g.count * g.dim) return;
    const unsigned long long b = i / g.dim, d = i - b * g.dim;
    if (rows_id_ok(ids, b, d, fault, g)) flat[g.offset + ids[b] * g.dim + d] = rows[i];
}
