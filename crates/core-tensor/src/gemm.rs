//! A bounds-checked front to the `gemm` crates' float32 kernels, the only
//! `unsafe` on the CPU path: every matrix product of the CPU backend goes
//! through [`matmul`].

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
    let isize_of = |x: usize| x as isize;
    // `dst` is row-major. `gemm`'s front computes such a product as its
    // transpose, `dstᵀ = rhsᵀ · lhsᵀ`, a column-major output, which its
    // microkernels prefer; it does so whenever the row stride (`n`) exceeds
    // the column stride (1). The same choice here keeps its bits.
    let (rows, cols, dst_cs, dst_rs, a, b) = if n > 1 {
        (n, m, isize_of(n), 1, rhs.t(), lhs.t())
    } else {
        (m, n, 1, isize_of(n), lhs, rhs)
    };
    // SAFETY: the asserts above prove that every index gemm derives from
    // (m, n, k) and the strides lies inside the corresponding slice (the
    // transposed views are the same elements, strides swapped); `dst` is
    // a unique borrow, so it cannot alias `lhs` or `rhs`. With `read_dst`
    // false gemm never reads `dst`, so its previous contents do not matter.
    unsafe {
        gemm_f32::gemm::f32::get_gemm_fn()(
            rows,
            cols,
            k,
            dst.data.as_mut_ptr(),
            dst_cs,
            dst_rs,
            accumulate,
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
