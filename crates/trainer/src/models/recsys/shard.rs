//! A rank's shard of the ratings, streamed: the chunks `rank`, `rank +
//! world_size`, ... of the file, read one at a time. Training visits them in
//! a fresh order every epoch and shuffles the ratings inside each one (the
//! shuffle buffer is one chunk); every rank trains the same number of full
//! batches, the smallest shard's. The test split reads the held-out ratings
//! of the same chunks in file order.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::bail;
use core_tensor::{Ops, rng};
use launcher::contract::Misconfigured;
use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::RecsysBuffers;
use super::ratings::{Rating, RatingsIndex};
use crate::data::{Batches, DataFingerprint, Order};

/// One split (training or test) of a ratings file, for one rank.
#[derive(Debug)]
pub struct RatingsShard {
    index: Arc<RatingsIndex>,
    test: bool,
    /// The epoch's chunks still to read, its batch sizes, and the seed of
    /// the in-chunk shuffle (`None`: file order).
    queue: VecDeque<usize>,
    sizes: Vec<usize>,
    shuffle: Option<u64>,
    next_step: usize,
    /// Ratings read but not yet batched: at most a chunk and a batch.
    pending: VecDeque<Rating>,
    chunk: Vec<Rating>,
    ids: Vec<u32>,
    targets: Vec<f32>,
}

/// Fisher–Yates with ChaCha8 words: the same order on every machine.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    for i in (1..items.len()).rev() {
        items.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
}

impl RatingsShard {
    pub fn new(index: Arc<RatingsIndex>, test: bool) -> Self {
        Self {
            index,
            test,
            queue: VecDeque::new(),
            sizes: Vec::new(),
            shuffle: None,
            next_step: 0,
            pending: VecDeque::new(),
            chunk: Vec::new(),
            ids: Vec::new(),
            targets: Vec::new(),
        }
    }

    fn count(&self, chunk: usize) -> usize {
        let c = &self.index.chunks[chunk];
        if self.test { c.test } else { c.train }
    }

    /// The next batch of `n` ratings, reading chunks as needed.
    fn next_batch(&mut self, n: usize) -> anyhow::Result<()> {
        while self.pending.len() < n {
            let Some(i) = self.queue.pop_front() else {
                bail!("the shard ran out of ratings (did the file change?)");
            };
            self.chunk.clear();
            self.index.read_chunk(i, self.test, &mut self.chunk)?;
            if let Some(seed) = self.shuffle {
                shuffle(&mut self.chunk, rng::derive_seed(seed, &[i as u64]));
            }
            self.pending.extend(self.chunk.drain(..));
        }
        let users = self.index.users;
        self.ids.clear();
        self.targets.clear();
        for r in self.pending.drain(..n) {
            self.ids.extend([r.user, users + r.item]);
            self.targets.push(r.rating);
        }
        Ok(())
    }
}

impl<B: Ops> Batches<B, RecsysBuffers<B>> for RatingsShard {
    fn sample_count(&self) -> usize {
        let (train, test) = self.index.counts();
        if self.test { test } else { train }
    }

    fn fingerprint(&self) -> DataFingerprint {
        self.index.fingerprints[usize::from(self.test)]
    }

    fn start_epoch(
        &mut self,
        _: &B,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>> {
        let (rank, world_size) = match *order {
            Order::Shuffled {
                resumed: Some(r),
                world_size,
                ..
            } if r.replicas != world_size => bail!(Misconfigured(format!(
                "the ratings stream in chunks shuffled per rank, so an epoch begun on {} replicas cannot go on with {world_size}: resume from an epoch-boundary checkpoint (ckpt-eNNNN-s000000), or with {0} replicas",
                r.replicas
            ))),
            Order::Shuffled {
                rank, world_size, ..
            }
            | Order::Strided { rank, world_size } => (rank, world_size),
            Order::Units { .. } => bail!(Misconfigured(
                "the ratings stream in chunks shuffled per rank, not in one global order: they train without --reproducible".to_string()
            )),
        };
        let chunks = self.index.chunks.len();
        let shard = |r: usize| (r..chunks).step_by(world_size);
        let mut mine: Vec<usize> = shard(rank).collect();
        let have: usize = mine.iter().map(|&c| self.count(c)).sum();
        (self.sizes, self.shuffle) = match *order {
            Order::Shuffled { seed, .. } => {
                let steps = (0..world_size)
                    .map(|r| shard(r).map(|c| self.count(c)).sum::<usize>() / batch)
                    .min()
                    .unwrap_or(0);
                if steps == 0 {
                    bail!(
                        "{} has too few ratings for a batch of {batch} on each of {world_size} ranks (rank r reads chunks r, r + {world_size}, ... of {}): lower --batch-size or the world size",
                        self.index.path.display(),
                        chunks
                    );
                }
                let seed = rng::derive_seed(seed, &[epoch, rank as u64]);
                shuffle(&mut mine, seed);
                (vec![batch; steps], Some(seed))
            }
            Order::Strided { .. } | Order::Units { .. } => {
                let sizes = (0..have)
                    .step_by(batch)
                    .map(|s| batch.min(have - s))
                    .collect();
                (sizes, None)
            }
        };
        self.queue = mine.into();
        self.pending.clear();
        self.next_step = 0;
        Ok(self.sizes.clone())
    }

    /// Streams to batch `step`; steps skipped (a resumed epoch) are read
    /// and dropped, so the batches after them are the same.
    fn fill(&mut self, backend: &B, step: usize, buf: &mut RecsysBuffers<B>) -> anyhow::Result<()> {
        if step < self.next_step || step >= self.sizes.len() {
            bail!("batch {step} is not next in this epoch");
        }
        while self.next_step <= step {
            self.next_batch(self.sizes[self.next_step])?;
            self.next_step += 1;
        }
        backend.write_range(&self.ids, &mut buf.ids, 0)?;
        backend.write_range(&self.targets, &mut buf.target, 0)?;
        buf.rows.clear();
        buf.rows.extend_from_slice(&self.ids);
        buf.rows.sort_unstable();
        buf.rows.dedup();
        Ok(())
    }
}
