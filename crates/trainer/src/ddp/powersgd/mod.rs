//! `--comm-hook powersgd:RANK[:START]`: PyTorch's `powerSGD_hook`
//! (torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py) on the
//! host's ring, with error feedback and warm start. Plain float32
//! all-reduces while fewer than START optimizer steps are done (PyTorch's
//! `iter < start_powerSGD_iter`; its `iter` counts the hook's steps, which
//! here are the optimizer's, so a resumed run knows it from the
//! checkpoint); after that each bucket's matrices travel as rank-RANK
//! factors (`bucket.rs`), the rest as float32.
//!
//! Differences from PyTorch, none of them in what is computed: the first
//! `Q`s are drawn from the run's seed (PyTorch: NumPy's generator seeded 0,
//! then `torch.randn`), so the numbers match PyTorch's in distribution,
//! not bit for bit; Gram-Schmidt serves every rank (PyTorch uses QR above
//! rank 2: the same columns up to sign, which `P Qᵀ` cancels); the rest
//! and the `P`s share one all-reduce; START may be 0 or 1 (PyTorch refuses
//! them because DDP rebuilds its buckets after the first step; these
//! buckets never change).
//!
//! The state is this rank's error feedback and the `Q`s (the same on every
//! rank); checkpoints hold both ([`PowerSgdState`]), every rank's error,
//! so a resumed run continues bit for bit.

mod bucket;
mod linalg;

use std::ops::Range;

use anyhow::{Context, anyhow, bail};
use core_tensor::{FlatLayout, rng};

pub use bucket::{BucketCodec, Matrix};

/// Tells PowerSGD's seeds from the other streams of the run's seed.
const SEED_TAG: u64 = 0x0050_5753_4744; // "PWSGD"

/// The hook's settings and every bucket's codec.
pub struct PowerSgd {
    /// Optimizer steps of plain all-reduces first.
    pub start: u64,
    /// Each bucket's codec, in bucket order; `None` while it travels to
    /// the communication thread and back.
    buckets: Vec<Option<Box<BucketCodec>>>,
    /// Each bucket's range of the gradients.
    ranges: Vec<Range<usize>>,
}

/// What a checkpoint holds of PowerSGD.
#[derive(Clone, Debug, PartialEq)]
pub struct PowerSgdState {
    /// Each compressed parameter's `Q` (`cols × rank`, row-major), by name.
    pub q: Vec<(String, [usize; 2], Vec<f32>)>,
    /// This rank's error feedback over the gradients it averages (empty
    /// in a state to restore: zeros).
    pub error: Vec<f32>,
}

impl PowerSgd {
    /// The codecs of `buckets` (ranges of a gradient buffer holding the
    /// parameters of `layout` from `base` on) at `rank`, first `Q`s from
    /// `seed`.
    pub fn plan(
        layout: &FlatLayout,
        base: usize,
        buckets: &[Range<usize>],
        (rank, start, seed): (usize, u64, u64),
    ) -> Self {
        let codecs = buckets
            .iter()
            .map(|bucket| {
                let matrices = (layout.views().iter().enumerate())
                    .filter(|(_, v)| bucket.contains(&(v.range.start - base)))
                    .map(|(i, v)| {
                        let at =
                            v.range.start - base - bucket.start..v.range.end - base - bucket.start;
                        let seed = rng::derive_seed(seed, &[SEED_TAG, i as u64]);
                        Matrix::new(&v.spec.name, at, &v.spec.shape, rank, seed)
                    })
                    .collect();
                Some(Box::new(BucketCodec::new(matrices, bucket.len())))
            })
            .collect();
        PowerSgd {
            start,
            buckets: codecs,
            ranges: buckets.to_vec(),
        }
    }

    /// Bucket `i`'s codec, to travel with its gradients.
    pub fn take(&mut self, i: usize) -> anyhow::Result<Box<BucketCodec>> {
        self.buckets[i]
            .take()
            .ok_or_else(|| anyhow!("PowerSGD's state of bucket {i} is still in flight"))
    }

    /// Whether bucket `i`'s codec is away (launched, not yet finished).
    pub fn away(&self, i: usize) -> bool {
        self.buckets[i].is_none()
    }

    /// Bucket `i`'s codec, back.
    pub fn put(&mut self, i: usize, codec: Box<BucketCodec>) {
        self.buckets[i] = Some(codec);
    }

    /// The f32 elements bucket `i`'s collectives carry when compressed.
    pub fn elements(&self, i: usize) -> usize {
        self.buckets[i]
            .as_ref()
            .map_or(0, |c| c.elements().iter().sum())
    }

    /// The state, once a compressed step has made it (`None` before).
    pub fn state(&self) -> anyhow::Result<Option<PowerSgdState>> {
        let codecs = self.codecs()?;
        if codecs.iter().all(|c| c.q.is_empty()) {
            return Ok(None);
        }
        let len = self.ranges.iter().map(|r| r.end).max().unwrap_or(0);
        let mut state = PowerSgdState {
            q: Vec::new(),
            error: vec![0.0; len],
        };
        for (codec, range) in codecs.iter().zip(&self.ranges) {
            state.error[range.clone()].copy_from_slice(&codec.error);
            if codec.q.is_empty() {
                continue;
            }
            for m in codec.matrices().iter().filter(|m| m.rank > 0) {
                let q = codec.q[m.q_at..m.q_at + m.cols * m.rank].to_vec();
                state.q.push((m.name.clone(), [m.cols, m.rank], q));
            }
        }
        Ok(Some(state))
    }

    /// Continues from `state` (a checkpoint's, of the same RANK).
    pub fn restore(&mut self, state: &PowerSgdState) -> anyhow::Result<()> {
        let ranges = self.ranges.clone();
        for (bucket, range) in self.buckets.iter_mut().zip(&ranges) {
            let codec = bucket.as_mut().context("PowerSGD's state is in flight")?;
            match state.error.get(range.clone()) {
                _ if state.error.is_empty() => codec.error.fill(0.0),
                Some(error) => codec.error.copy_from_slice(error),
                None => bail!("the checkpoint's PowerSGD error is shorter than the gradients"),
            }
            let mut q = Vec::new();
            for m in codec.matrices().iter().filter(|m| m.rank > 0) {
                let Some((_, shape, values)) = state.q.iter().find(|(name, ..)| *name == m.name)
                else {
                    bail!("the checkpoint holds no PowerSGD Q of {}", m.name);
                };
                if *shape != [m.cols, m.rank] {
                    bail!(
                        "the checkpoint's PowerSGD Q of {} is {}×{}, this run's {}×{} (another RANK?)",
                        m.name,
                        shape[0],
                        shape[1],
                        m.cols,
                        m.rank
                    );
                }
                q.extend_from_slice(values);
            }
            codec.q = q;
        }
        Ok(())
    }

    fn codecs(&self) -> anyhow::Result<Vec<&BucketCodec>> {
        self.buckets
            .iter()
            .map(|b| b.as_deref().context("PowerSGD's state is in flight"))
            .collect()
    }
}
