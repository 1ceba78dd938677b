//! One gradient bucket under PowerSGD: what `powerSGD_hook` does to a
//! bucket once `iter >= start_powerSGD_iter`, with error feedback and warm
//! start, step for step (PyTorch's numbers in parentheses):
//!
//! 1. the bucket plus this rank's error of the last step (I), a copy kept;
//! 2. its matrices worth compressing (`_should_compress`) and the rest;
//! 3. each matrix's `Q` orthonormalized (warm start; the first time: normal
//!    samples, the same on every rank), `P = M Q` (III);
//! 4. one sum over the ranks of the rest and the `P`s together (PyTorch
//!    sends them in two all-reduces), the rest divided by the world size
//!    (II);
//! 5. each `P` orthonormalized, `Q = Mᵀ P`, the `Q`s averaged;
//! 6. each matrix replaced by `P Qᵀ`; the error is the copy minus the
//!    bucket now (biases included, as PyTorch's).

use comm::{CommError, Communicator, ReduceOp};

use super::linalg::{m_times_q, mt_times_p, normal, orthonormalize, p_times_qt};
use crate::comm_thread::Reduction;

/// PyTorch's `min_compression_rate` default.
const MIN_COMPRESSION_RATE: usize = 2;

/// A parameter of the bucket, viewed as PyTorch views it
/// (`tensor.view(tensor.shape[0], -1)`).
#[derive(Clone, Debug, PartialEq)]
pub struct Matrix {
    /// The parameter's name (`fc1.weight`).
    pub name: String,
    /// Its elements in the bucket.
    pub at: std::ops::Range<usize>,
    pub rows: usize,
    pub cols: usize,
    /// The approximation's rank (`min(rows, cols, RANK)`); 0: sent whole.
    pub rank: usize,
    /// Where its `Q` starts in the bucket's `Q`s.
    pub q_at: usize,
    /// Where its `Q`'s first samples come from.
    pub seed: u64,
}

impl Matrix {
    /// `rows × cols` at `at` of a bucket, compressed at `rank` if that
    /// saves at least half its elements.
    pub fn new(
        name: &str,
        at: std::ops::Range<usize>,
        shape: &[usize],
        rank: usize,
        seed: u64,
    ) -> Self {
        let rows = shape.first().copied().unwrap_or(1);
        let cols = at.len() / rows.max(1);
        let rank = rank.min(rows).min(cols);
        let worth = shape.len() > 1 && (rows + cols) * rank * MIN_COMPRESSION_RATE < rows * cols;
        Matrix {
            name: name.to_string(),
            at,
            rows,
            cols,
            rank: if worth { rank } else { 0 },
            q_at: 0,
            seed,
        }
    }

    fn compressed(&self) -> bool {
        self.rank > 0
    }
}

/// A bucket's PowerSGD state (this rank's error, the `Q`s) and scratch.
pub struct BucketCodec {
    matrices: Vec<Matrix>,
    /// Elements of the bucket sent whole, and of the `P`s and `Q`s.
    whole: usize,
    ps: usize,
    qs: usize,
    /// This rank's error feedback over the bucket (zeros at first).
    pub error: Vec<f32>,
    /// Every compressed matrix's `Q` (`cols × rank`, row-major), each where
    /// its [`Matrix::q_at`] says; empty until the first compressed step.
    pub q: Vec<f32>,
}

impl BucketCodec {
    pub fn new(mut matrices: Vec<Matrix>, len: usize) -> Self {
        let mut qs = 0;
        for m in matrices.iter_mut().filter(|m| m.compressed()) {
            m.q_at = qs;
            qs += m.cols * m.rank;
        }
        let compressed = matrices.iter().filter(|m| m.compressed());
        let ps = compressed.map(|m| m.rows * m.rank).sum();
        let whole = matrices
            .iter()
            .filter(|m| !m.compressed())
            .map(|m| m.at.len())
            .sum();
        BucketCodec {
            matrices,
            whole,
            ps,
            qs,
            error: vec![0.0; len],
            q: Vec::new(),
        }
    }

    pub fn matrices(&self) -> &[Matrix] {
        &self.matrices
    }

    /// The f32 elements its collectives carry: the parameters sent whole
    /// and the `P`s in one, the `Q`s in the other.
    pub fn elements(&self) -> [usize; 2] {
        [self.whole + self.ps, self.qs]
    }

    /// Step 3's `Q`s: warm, or the first ones.
    fn prepare_qs(&mut self) {
        let first = self.q.is_empty();
        if first {
            self.q = vec![0.0; self.qs];
        }
        for m in self.matrices.iter().filter(|m| m.compressed()) {
            let q = &mut self.q[m.q_at..m.q_at + m.cols * m.rank];
            if first {
                normal(m.seed, q);
            }
            orthonormalize(q, (m.cols, m.rank));
        }
    }
}

impl Reduction for BucketCodec {
    fn reduce(&mut self, comm: &mut dyn Communicator, buf: &mut [f32]) -> Result<(), CommError> {
        let world = comm.world_size();
        // 1.
        for (g, e) in buf.iter_mut().zip(&self.error) {
            *g += e;
        }
        let kept = buf.to_vec();
        // 2-3: the parameters sent whole, then the P's, in one buffer.
        self.prepare_qs();
        let mut first = Vec::with_capacity(self.whole + self.ps);
        for m in self.matrices.iter().filter(|m| !m.compressed()) {
            first.extend_from_slice(&buf[m.at.clone()]);
        }
        let mut p_at = Vec::with_capacity(self.matrices.len());
        for m in self.matrices.iter().filter(|m| m.compressed()) {
            let start = first.len();
            first.resize(start + m.rows * m.rank, 0.0);
            let q = &self.q[m.q_at..m.q_at + m.cols * m.rank];
            m_times_q(
                &buf[m.at.clone()],
                q,
                (m.rows, m.cols, m.rank),
                &mut first[start..],
            );
            p_at.push(start);
        }
        // 4: a sum, so the P's are not divided (they are orthonormalized
        // next); the rest divided as the ring's average divides.
        comm.all_reduce(&mut first, ReduceOp::Sum)?;
        let scale = 1.0 / world as f32;
        let mut at = 0;
        for m in self.matrices.iter().filter(|m| !m.compressed()) {
            for (g, s) in buf[m.at.clone()].iter_mut().zip(&first[at..]) {
                *g = s * scale;
            }
            at += m.at.len();
        }
        // 5.
        let compressed = self.matrices.iter().filter(|m| m.compressed());
        for (m, &p) in compressed.clone().zip(&p_at) {
            let p = &mut first[p..p + m.rows * m.rank];
            orthonormalize(p, (m.rows, m.rank));
            let q = &mut self.q[m.q_at..m.q_at + m.cols * m.rank];
            mt_times_p(&buf[m.at.clone()], p, (m.rows, m.cols, m.rank), q);
        }
        comm.all_reduce(&mut self.q, ReduceOp::Avg)?;
        // 6.
        for (m, &p) in compressed.zip(&p_at) {
            let p = &first[p..p + m.rows * m.rank];
            let q = &self.q[m.q_at..m.q_at + m.cols * m.rank];
            p_times_qt(p, q, (m.rows, m.cols, m.rank), &mut buf[m.at.clone()]);
        }
        for ((e, k), g) in self.error.iter_mut().zip(&kept).zip(buf.iter()) {
            *e = k - g;
        }
        Ok(())
    }

    fn bytes(&self) -> usize {
        4 * self.elements().iter().sum::<usize>()
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use comm::LocalCommunicator;

    /// Two ranks whose matrices share their column space (`u v_rᵀ`): the
    /// average `u v̄ᵀ` has rank 1, which rank-1 PowerSGD recovers in its
    /// first step, with no error left; the bias is averaged exactly.
    #[test]
    fn a_rank_one_average_is_recovered_and_the_bias_averaged() {
        let (rows, cols) = (6, 40);
        let u: Vec<f32> = (0..rows).map(|i| 1.0 + i as f32 / 4.0).collect();
        let v = |r: usize| -> Vec<f32> {
            (0..cols)
                .map(|j| ((j * (r + 3)) % 7) as f32 - 3.0)
                .collect()
        };
        let comms = LocalCommunicator::job(2, std::time::Duration::from_secs(10));
        let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
            let ranks: Vec<_> = (comms.into_iter().enumerate())
                .map(|(r, mut comm)| {
                    let (u, v) = (&u, v(r));
                    s.spawn(move || {
                        let mut buf = vec![r as f32 + 0.5, -(r as f32)];
                        buf.extend(u.iter().flat_map(|a| v.iter().map(move |b| a * b)));
                        let matrices = vec![
                            Matrix::new("bias", 0..2, &[2], 1, 0),
                            Matrix::new("weight", 2..2 + rows * cols, &[rows, cols], 1, 7),
                        ];
                        let mut codec = BucketCodec::new(matrices, buf.len());
                        codec.reduce(&mut comm, &mut buf).unwrap();
                        (buf, codec.error)
                    })
                })
                .collect();
            ranks.into_iter().map(|r| r.join().unwrap()).collect()
        });
        assert_eq!(results[0].0, results[1].0, "the ranks agree bit for bit");
        let got = &results[0].0;
        assert_eq!(got[..2], [1.0, -0.5], "the bias is averaged");
        let (v0, v1) = (v(0), v(1));
        for i in 0..rows {
            for j in 0..cols {
                let want = u[i] * (v0[j] + v1[j]) / 2.0;
                let have = got[2 + i * cols + j];
                assert!(
                    (have - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "({i}, {j}): {have} vs {want}"
                );
            }
        }
        // What each rank sent differs from the average by its own share:
        // the errors of the two ranks cancel.
        for k in 0..got.len() {
            let sum = results[0].1[k] + results[1].1[k];
            assert!(
                sum.abs() <= 1e-3,
                "element {k}: errors {} and {}",
                results[0].1[k],
                results[1].1[k]
            );
        }
    }

    #[test]
    fn matrices_are_compressed_only_where_that_saves_half() {
        // fc1 of the CNN at rank 4: (128 + 9216)·4·2 < 128·9216.
        let fc1 = Matrix::new("w", 0..128 * 9216, &[128, 9216], 4, 0);
        assert_eq!((fc1.rows, fc1.cols, fc1.rank), (128, 9216, 4));
        // conv1 (32, 1, 3, 3) as 32×9: rank 1 saves, rank 4 does not.
        assert_eq!(Matrix::new("w", 0..288, &[32, 1, 3, 3], 1, 0).rank, 1);
        assert_eq!(Matrix::new("w", 0..288, &[32, 1, 3, 3], 4, 0).rank, 0);
        // A bias is sent whole.
        assert_eq!(Matrix::new("w", 0..128, &[128], 1, 0).rank, 0);
        let codec = BucketCodec::new(
            vec![
                Matrix::new("w", 0..10, &[10], 1, 0),
                Matrix::new("w", 10..10 + 64 * 288, &[64, 32, 3, 3], 2, 0),
            ],
            10 + 64 * 288,
        );
        assert_eq!(codec.elements(), [10 + 64 * 2, 288 * 2]);
    }
}
