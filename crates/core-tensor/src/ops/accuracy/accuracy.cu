// The number of rows whose argmax (first maximum, strict `>` scan as in
// accuracy/cpu.rs) equals the label, in one block: an integer count, so the
// tree reduction is exact, added to correct[0] as one f32 like the CPU does.

#include "reduce.cuh"

// Mirrors `ClassGeom` (usize fields) field by field.
struct ClassGeom {
    unsigned long long batch, classes;
};

extern "C" __global__ void __launch_bounds__(REDUCE_THREADS)
    count_correct_f32(const float* logits, const unsigned char* labels, float* correct,
                      ClassGeom g) {
    const int batch = (int)g.batch, classes = (int)g.classes;
    int hits = 0;
    for (int row = threadIdx.x; row < batch; row += REDUCE_THREADS) {
        const float* z = logits + (long long)row * classes;
        int best = 0;
        for (int c = 1; c < classes; ++c) {
            if (z[c] > z[best]) best = c;
        }
        hits += best == (int)labels[row];
    }
    hits = block_sum(hits);
    if (threadIdx.x == 0) correct[0] += (float)hits;
}
