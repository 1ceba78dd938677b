//! The toy model's synthetic data set, generated from the run's seed: inputs
//! uniform in ±1, targets a fixed random linear teacher's outputs plus a
//! little uniform noise, so that the loss can fall. Small enough to live in
//! host memory; each batch is copied to the device.

use core_tensor::{Ops, rng};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::{IN_FEATURES, OUT_FEATURES};
use crate::data::{Batches, DataFingerprint, EpochPlan, Hasher, Order};
use crate::model::layered::{BatchInputs, stretches};
use crate::model::unit_f32;

/// The amplitude of the uniform noise added to the teacher's outputs.
const NOISE: f32 = 0.05;

/// `len` samples of `IN_FEATURES` inputs and `OUT_FEATURES` targets.
#[derive(Debug)]
pub struct ToyData {
    x: Vec<f32>,
    y: Vec<f32>,
    len: usize,
    fingerprint: DataFingerprint,
    plan: EpochPlan,
    /// One part of a batch, gathered on the host before its copy to the
    /// device.
    part: Vec<f32>,
}

impl ToyData {
    /// `len` samples, the same for the same `seed` on every machine.
    pub fn generate(seed: u64, len: usize) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(rng::derive_seed(seed, &[0x7079]));
        let mut uniform = |bound: f32| (2.0 * unit_f32(&mut rng) - 1.0) * bound;
        let teacher_w: Vec<f32> = (0..OUT_FEATURES * IN_FEATURES)
            .map(|_| uniform(1.0))
            .collect();
        let teacher_b: Vec<f32> = (0..OUT_FEATURES).map(|_| uniform(0.5)).collect();
        let x: Vec<f32> = (0..len * IN_FEATURES).map(|_| uniform(1.0)).collect();
        let mut y = Vec::with_capacity(len * OUT_FEATURES);
        for row in x.chunks(IN_FEATURES) {
            for (w, &b) in teacher_w.chunks(IN_FEATURES).zip(&teacher_b) {
                let dot: f32 = w.iter().zip(row).map(|(w, x)| w * x).sum();
                y.push(dot + b + uniform(NOISE));
            }
        }
        let mut h = Hasher::new();
        h.write_f32s(&x);
        h.write_f32s(&y);
        Self {
            fingerprint: h.finish(len as u64),
            x,
            y,
            len,
            plan: EpochPlan::default(),
            part: Vec::new(),
        }
    }
}

/// Fills the whole toy's buffers, or a pipeline stage's.
impl<B: Ops, Buf: BatchInputs<B, f32>> Batches<B, Buf> for ToyData {
    fn sample_count(&self) -> usize {
        self.len
    }

    fn fingerprint(&self) -> DataFingerprint {
        self.fingerprint
    }

    fn start_epoch(
        &mut self,
        _: &B,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>> {
        self.plan = order.plan(self.len, epoch, batch)?;
        Ok(self.plan.sizes())
    }

    /// Copies each part's inputs and targets from its stretch of the
    /// batch.
    fn fill(&mut self, backend: &B, step: usize, buffers: &mut Buf) -> anyhow::Result<()> {
        let Some(positions) = self.plan.batches.get(step) else {
            anyhow::bail!("batch {step} is not in this epoch");
        };
        for (stretch, part) in stretches(buffers, step, positions.clone())? {
            let rows = &self.plan.indices[stretch];
            for (values, width, to) in [
                (&self.x, IN_FEATURES, part.inputs),
                (&self.y, OUT_FEATURES, part.targets),
            ] {
                let Some(to) = to else { continue };
                self.part.clear();
                for &i in rows {
                    self.part
                        .extend_from_slice(&values[i * width..(i + 1) * width]);
                }
                backend.write_range(&self.part, to, 0)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_is_a_function_of_the_seed() {
        let (a, b, c) = (
            ToyData::generate(1, 50),
            ToyData::generate(1, 50),
            ToyData::generate(2, 50),
        );
        assert_eq!((&a.x, &a.y), (&b.x, &b.y));
        assert_ne!(a.y, c.y);
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_ne!(a.fingerprint, c.fingerprint);
        let longer = ToyData::generate(1, 51);
        assert_eq!(longer.fingerprint.samples, 51);
        assert_ne!(longer.fingerprint.hash, a.fingerprint.hash);
        assert_eq!((a.x.len(), a.y.len()), (500, 250));
        assert!(a.x.iter().all(|v| v.abs() <= 1.0));
    }
}
