//! A bounds-checked front to the `gemm` crates' float32 kernels, the only
//! `unsafe` on the CPU path: every matrix product of the CPU backend goes
//! through [`matmul`].
//!
//! It also fixes the arithmetic: each output element is the sum of fused
//! multiply-add chains over blocks of `k` that [`k_blocks`] cuts (not gemm,
//! whose cut follows the CPU's cache), and the products gemm would sum
//! across SIMD lanes are computed here as such chains. So a product's bits
//! depend on its shape and strides alone — not on the CPU, its vector width
//! or the thread count — and a row of the output does not depend on the
//! other rows (`tests::`).

use std::ops::Range;

pub(crate) use gemm_common::Parallelism;

/// A read-only strided matrix view: element `(r, c)` is
/// `data[r * row_stride + c * col_stride]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            row_stride: cols,
            col_stride: 1,
        }
    }

    /// The transpose, as a view of the same memory.
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            row_stride: self.col_stride,
            col_stride: self.row_stride,
        }
    }

    /// Columns `range` of it (`range` within `0..cols`).
    fn columns(self, range: Range<usize>) -> Self {
        Self {
            data: &self.data[range.start * self.col_stride..],
            cols: range.len(),
            ..self
        }
    }

    /// Rows `range` of it (`range` within `0..rows`).
    fn rows(self, range: Range<usize>) -> Self {
        Self {
            data: &self.data[range.start * self.row_stride..],
            rows: range.len(),
            ..self
        }
    }

    fn fits(&self) -> bool {
        fits(
            self.data.len(),
            self.rows,
            self.cols,
            self.row_stride,
            self.col_stride,
        )
    }
}

/// A row-major `rows × cols` output matrix.
#[derive(Debug)]
pub(crate) struct MatMut<'a> {
    pub data: &'a mut [f32],
    pub rows: usize,
    pub cols: usize,
}

impl<'a> MatMut<'a> {
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self { data, rows, cols }
    }
}

/// Whether the highest index a strided view touches lies inside the slice.
fn fits(len: usize, rows: usize, cols: usize, row_stride: usize, col_stride: usize) -> bool {
    if rows == 0 || cols == 0 {
        return true;
    }
    let last = (rows - 1).checked_mul(row_stride).and_then(|a| {
        (cols - 1)
            .checked_mul(col_stride)
            .and_then(|b| a.checked_add(b))
    });
    matches!(last, Some(last) if last < len)
}

/// `dst = lhs · rhs`, or `dst += lhs · rhs` when `accumulate`.
///
/// # Panics
/// When the shapes disagree or a view reaches outside its slice: callers
/// validate user-facing sizes first, so this is a bug, and it must never turn
/// into an out-of-bounds access.
pub(crate) fn matmul(
    dst: MatMut<'_>,
    accumulate: bool,
    lhs: MatRef<'_>,
    rhs: MatRef<'_>,
    par: Parallelism,
) {
    assert_eq!(lhs.cols, rhs.rows, "matmul: inner dimensions differ");
    assert_eq!(
        (dst.rows, dst.cols),
        (lhs.rows, rhs.cols),
        "matmul: output shape differs"
    );
    assert!(
        lhs.fits() && rhs.fits(),
        "matmul: an input view reaches outside its slice"
    );
    assert!(
        fits(dst.data.len(), dst.rows, dst.cols, dst.cols, 1),
        "matmul: output too small"
    );
    let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            dst.data[..m * n].fill(0.0);
        }
        return;
    }
    // `dst` is row-major. `gemm`'s front computes such a product as its
    // transpose, `dstᵀ = rhsᵀ · lhsᵀ`, a column-major output, which its
    // microkernels prefer; it does so whenever the row stride (`n`) exceeds
    // the column stride (1). The same choice here keeps its bits.
    let (product, a, b) = if n > 1 {
        let product = Product {
            rows: n,
            cols: m,
            dst_cs: n,
            dst_rs: 1,
        };
        (product, rhs.t(), lhs.t())
    } else {
        let product = Product {
            rows: m,
            cols: n,
            dst_cs: 1,
            dst_rs: n,
        };
        (product, lhs, rhs)
    };
    let lane_bound = product.lane_bound(&a, &b);
    for (i, block) in k_blocks(product.rows, product.cols, k)
        .into_iter()
        .enumerate()
    {
        let read_dst = accumulate || i > 0;
        let (a, b) = (a.columns(block.clone()), b.rows(block.clone()));
        // A block of one or two terms would take gemm's `gevv` path, which
        // rounds otherwise than its microkernels do inside a longer sum.
        if lane_bound || (i > 0 && block.len() <= 2) {
            product.chains(dst.data, read_dst, a, b);
        } else {
            product.gemm(dst.data, read_dst, a, b, par);
        }
    }
}

/// The longest sum gemm's microkernels reduce in one chain before they add
/// it to the output: gemm's own block depth on the machines we run on,
/// where it derives it from the L1 cache (`gemm_common::cache`) and never
/// goes below it.
const KC: usize = 512;

/// The blocks `k` is summed in: each one chain from zero, added to the
/// output in order. This is gemm's cut at a block depth of [`KC`]: for a
/// product of at most 64 × 64 blocks of `KC` and the rest, otherwise the
/// fewest blocks of at most `KC`, of (nearly) equal length. Cutting here,
/// not in gemm, keeps the cut off the machine's cache geometry, which gemm
/// would otherwise read from CPUID: the same bits on every CPU.
fn k_blocks(rows: usize, cols: usize, k: usize) -> Vec<Range<usize>> {
    let len = if rows <= 64 && cols <= 64 {
        KC
    } else {
        k.div_ceil(k.div_ceil(KC))
    };
    (0..k)
        .step_by(len.max(1))
        .map(|start| start..(start + len).min(k))
        .collect()
}

/// A product as gemm is asked for it: `rows × cols` of the column-major (or
/// row-major, for a single column) output, and the output's strides.
struct Product {
    rows: usize,
    cols: usize,
    dst_cs: usize,
    dst_rs: usize,
}

impl Product {
    /// Whether gemm would sum along `k` across SIMD lanes, so that the
    /// vector width (AVX2's 8 floats, AVX-512's 16) would decide the order
    /// of the terms: its "horizontal" kernels for outputs of at most 16 × 16
    /// and its row-major matrix-vector products, both taken when `a`'s rows
    /// and `b`'s columns are contiguous along `k`.
    fn lane_bound(&self, a: &MatRef<'_>, b: &MatRef<'_>) -> bool {
        let small = self.rows * self.cols <= 16 * 16 || self.rows <= 1 || self.cols <= 1;
        small && a.col_stride == 1 && b.row_stride == 1
    }

    /// `dst (+)= a · b` as gemm's microkernels compute each element: one
    /// fused multiply-add chain from zero over the block, then added to the
    /// output. Used where gemm's own path would depend on the vector width.
    fn chains(&self, dst: &mut [f32], read_dst: bool, a: MatRef<'_>, b: MatRef<'_>) {
        for r in 0..self.rows {
            for c in 0..self.cols {
                let sum = (0..a.cols).fold(0.0f32, |acc, t| {
                    a.data[r * a.row_stride + t * a.col_stride]
                        .mul_add(b.data[t * b.row_stride + c * b.col_stride], acc)
                });
                let out = &mut dst[r * self.dst_rs + c * self.dst_cs];
                *out = if read_dst { *out + sum } else { sum };
            }
        }
    }

    /// `dst (+)= a · b` by gemm, whose depth `a.cols` is at most [`KC`], so
    /// that it sums it in one block.
    fn gemm(
        &self,
        dst: &mut [f32],
        read_dst: bool,
        a: MatRef<'_>,
        b: MatRef<'_>,
        par: Parallelism,
    ) {
        let isize_of = |x: usize| x as isize;
        debug_assert!(a.cols <= KC);
        // SAFETY: `matmul`'s asserts prove that every index gemm derives
        // from (rows, cols, k) and the strides lies inside the corresponding
        // slice (the transposed views are the same elements, strides
        // swapped; a block's views start inside theirs and end where they
        // end); `dst` is a unique borrow, so it cannot alias `a` or `b`.
        // With `read_dst` false gemm never reads `dst`, so its previous
        // contents do not matter.
        unsafe {
            gemm_f32::gemm::f32::get_gemm_fn()(
                self.rows,
                self.cols,
                a.cols,
                dst.as_mut_ptr(),
                isize_of(self.dst_cs),
                isize_of(self.dst_rs),
                read_dst,
                a.data.as_ptr(),
                isize_of(a.col_stride),
                isize_of(a.row_stride),
                b.data.as_ptr(),
                isize_of(b.col_stride),
                isize_of(b.row_stride),
                1.0,
                1.0,
                false,
                false,
                false,
                par,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matmul_matches_the_definition_for_transposed_views() {
        let a: Vec<f32> = (0..6).map(|x| x as f32).collect(); // 2x3
        let b: Vec<f32> = (0..12).map(|x| (x as f32) * 0.5 - 2.0).collect(); // 4x3, used transposed
        let mut c = vec![1.0; 8];
        let lhs = MatRef::row_major(&a, 2, 3);
        let rhs = MatRef::row_major(&b, 4, 3).t();
        matmul(
            MatMut::row_major(&mut c, 2, 4),
            true,
            lhs,
            rhs,
            Parallelism::None,
        );
        for i in 0..2 {
            for j in 0..4 {
                let want: f32 = 1.0 + (0..3).map(|k| a[i * 3 + k] * b[j * 3 + k]).sum::<f32>();
                assert_eq!(c[i * 4 + j], want, "element ({i},{j})");
            }
        }
    }

    /// The reference: each element one fused multiply-add chain per block
    /// of `blocks`, added in order, with scalar code (no lanes).
    fn chained(
        a: &[f32],
        b: &[f32],
        (m, n, k): (usize, usize, usize),
        blocks: &[Range<usize>],
    ) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                for (at, block) in blocks.iter().enumerate() {
                    let sum = block
                        .clone()
                        .fold(0.0f32, |acc, t| a[i * k + t].mul_add(b[t * n + j], acc));
                    let o = &mut out[i * n + j];
                    *o = if at == 0 { sum } else { *o + sum };
                }
            }
        }
        out
    }

    fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len as u32)
            .map(|i| {
                let h = (i ^ seed).wrapping_mul(0x9E37_79B9).rotate_left(13);
                (h % 2001) as f32 / 1000.0 - 1.0 + (h % 7) as f32 * 1e-4
            })
            .collect()
    }

    /// Shapes of every gemm path: its horizontal kernels (outputs of at most
    /// 16 x 16), its matrix-vector products (one row or column), its
    /// microkernels, with one block of k and with several, balanced (large
    /// outputs) or not (small). Equal to scalar chains on this CPU means
    /// equal on every CPU: the reference has no vector width and no cache.
    #[test]
    fn every_product_is_its_chains_of_fused_multiply_adds() {
        let shapes = [
            (16, 10, 128),
            (10, 16, 128),
            (4, 4, 9216),
            (1, 10, 300),
            (10, 1, 300),
            (64, 10, 128),
            (16, 128, 9216),
            (64, 128, 9216),
            (32, 9, 676),
            (48, 40, 1025),
            (70, 3, 1300),
        ];
        for (m, n, k) in shapes {
            let (a, b) = (values(m * k, 1), values(k * n, 2));
            let mut got = vec![f32::NAN; m * n];
            matmul(
                MatMut::row_major(&mut got, m, n),
                false,
                MatRef::row_major(&a, m, k),
                MatRef::row_major(&b, k, n),
                Parallelism::None,
            );
            // gemm sees the transpose when n > 1.
            let (rows, cols) = if n > 1 { (n, m) } else { (m, n) };
            let want = chained(&a, &b, (m, n, k), &k_blocks(rows, cols, k));
            let same = got
                .iter()
                .zip(&want)
                .all(|(g, w)| g.to_bits() == w.to_bits());
            assert!(same, "{m}x{n}x{k}: the product is not its chains");
        }
    }

    /// A sample's row of `x · Wᵀ` is the same bits in a batch of 1, 16 or 64.
    #[test]
    fn a_row_does_not_depend_on_the_other_rows() {
        for (features, k) in [(10, 128), (128, 9216)] {
            let (x, w) = (values(64 * k, 3), values(features * k, 4));
            let product = |rows: usize| {
                let mut y = vec![0.0f32; rows * features];
                matmul(
                    MatMut::row_major(&mut y, rows, features),
                    false,
                    MatRef::row_major(&x[..rows * k], rows, k),
                    MatRef::row_major(&w, features, k).t(),
                    Parallelism::Rayon(2),
                );
                y
            };
            let whole = product(64);
            for rows in [1, 16] {
                let part = product(rows);
                assert!(
                    part.iter()
                        .zip(&whole)
                        .all(|(p, w)| p.to_bits() == w.to_bits()),
                    "x·Wᵀ with {features} outputs: {rows} rows differ from the batch of 64's"
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "outside its slice")]
    fn a_view_larger_than_its_slice_is_refused() {
        let a = vec![0.0; 5];
        let mut c = vec![0.0; 4];
        matmul(
            MatMut::row_major(&mut c, 2, 2),
            false,
            MatRef::row_major(&a, 2, 3),
            MatRef::row_major(&a, 3, 2),
            Parallelism::None,
        );
    }
}
