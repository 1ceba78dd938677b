//! The small dense algebra of PowerSGD on the host, row-major f32, each
//! sum in one fixed order (so every rank computes the same bits from the
//! same inputs): `P = M Q`, `Q = Mᵀ P`, `M = P Qᵀ`, Gram-Schmidt, and the
//! normal samples of the first `Q`.

use core_tensor::rng;

/// `p (n×r) = m (n×k) · q (k×r)`.
pub fn m_times_q(m: &[f32], q: &[f32], (n, k, r): (usize, usize, usize), p: &mut [f32]) {
    p[..n * r].fill(0.0);
    for i in 0..n {
        let row = &m[i * k..(i + 1) * k];
        let out = &mut p[i * r..(i + 1) * r];
        for (j, &x) in row.iter().enumerate() {
            for (o, &y) in out.iter_mut().zip(&q[j * r..(j + 1) * r]) {
                *o += x * y;
            }
        }
    }
}

/// `q (k×r) = mᵀ (k×n) · p (n×r)`.
pub fn mt_times_p(m: &[f32], p: &[f32], (n, k, r): (usize, usize, usize), q: &mut [f32]) {
    q[..k * r].fill(0.0);
    for i in 0..n {
        let row = &m[i * k..(i + 1) * k];
        let p_row = &p[i * r..(i + 1) * r];
        for (j, &x) in row.iter().enumerate() {
            for (o, &y) in q[j * r..(j + 1) * r].iter_mut().zip(p_row) {
                *o += x * y;
            }
        }
    }
}

/// `m (n×k) = p (n×r) · qᵀ (r×k)`.
pub fn p_times_qt(p: &[f32], q: &[f32], (n, k, r): (usize, usize, usize), m: &mut [f32]) {
    for i in 0..n {
        let p_row = &p[i * r..(i + 1) * r];
        for j in 0..k {
            let q_row = &q[j * r..(j + 1) * r];
            m[i * k + j] = p_row.iter().zip(q_row).map(|(a, b)| a * b).sum();
        }
    }
}

/// Orthonormalizes the `r` columns of `a` (`n×r`, row-major) in place, as
/// PyTorch's `_orthogonalize_gram_schmidt` with epsilon 0: each column
/// divided by its norm, then its projection taken off the later columns.
/// A column of zeros stays zeros (PyTorch's intent; its division would
/// make NaNs). Norms and projections are summed in f64.
pub fn orthonormalize(a: &mut [f32], (n, r): (usize, usize)) {
    for c in 0..r {
        let norm = (0..n)
            .map(|i| f64::from(a[i * r + c]).powi(2))
            .sum::<f64>()
            .sqrt() as f32;
        for i in 0..n {
            let x = &mut a[i * r + c];
            *x = if norm > 0.0 { *x / norm } else { 0.0 };
        }
        for later in c + 1..r {
            let dot = (0..n)
                .map(|i| f64::from(a[i * r + c]) * f64::from(a[i * r + later]))
                .sum::<f64>() as f32;
            for i in 0..n {
                a[i * r + later] -= dot * a[i * r + c];
            }
        }
    }
}

/// Standard normal samples (Box-Muller over the counter generator), a
/// pure function of `seed` and the index: every rank draws the same.
pub fn normal(seed: u64, out: &mut [f32]) {
    for (i, x) in out.iter_mut().enumerate() {
        let i = i as u64;
        // (0, 1]: the logarithm stays finite.
        let u1 = 1.0 - f64::from(rng::uniform(seed, 2 * i));
        let u2 = f64::from(rng::uniform(seed, 2 * i + 1));
        *x = ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_products_agree_with_their_definitions() {
        // m = [[1, 2, 3], [4, 5, 6]], q = [[1, 0], [0, 1], [1, 1]]
        let m = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let q = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut p = [0.0; 4];
        m_times_q(&m, &q, (2, 3, 2), &mut p);
        assert_eq!(p, [4.0, 5.0, 10.0, 11.0]);
        let mut back = [0.0; 6];
        mt_times_p(&m, &p, (2, 3, 2), &mut back);
        // mᵀ p: row j = Σ_i m[i][j] p[i]
        assert_eq!(back, [44.0, 49.0, 58.0, 65.0, 72.0, 81.0]);
        let mut approx = [0.0; 6];
        p_times_qt(&p, &q, (2, 3, 2), &mut approx);
        assert_eq!(approx, [4.0, 5.0, 9.0, 10.0, 11.0, 21.0]);
    }

    #[test]
    fn gram_schmidt_makes_orthonormal_columns_and_keeps_zero_ones() {
        let mut a = [3.0f32, 1.0, 4.0, 1.0, 0.0, 2.0];
        orthonormalize(&mut a, (3, 2));
        let col = |c: usize| [a[c], a[2 + c], a[4 + c]];
        let dot = |x: [f32; 3], y: [f32; 3]| x.iter().zip(&y).map(|(a, b)| a * b).sum::<f32>();
        assert!((dot(col(0), col(0)) - 1.0).abs() < 1e-6);
        assert!((dot(col(1), col(1)) - 1.0).abs() < 1e-6);
        assert!(dot(col(0), col(1)).abs() < 1e-6);
        assert_eq!(col(0), [0.6, 0.8, 0.0], "the first column is only scaled");
        let mut zeros = [0.0f32; 4];
        orthonormalize(&mut zeros, (2, 2));
        assert_eq!(zeros, [0.0; 4]);
    }

    #[test]
    fn normal_samples_are_standard_and_reproducible() {
        let mut a = vec![0.0f32; 20_000];
        normal(5, &mut a);
        let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
        let var = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        let mut b = vec![0.0f32; 20_000];
        normal(5, &mut b);
        assert_eq!(a, b);
    }
}
