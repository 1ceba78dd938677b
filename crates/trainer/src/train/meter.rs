//! An epoch's running numbers: loss and correct predictions summed on the
//! device (read once, at the end), images seen, and training time without
//! the pauses for checkpoints.

use std::time::{Duration, Instant};

use core_tensor::Ops;

use crate::checkpoint::origin::Start;

/// A point inside an epoch to continue from (a mid-epoch checkpoint).
pub(super) struct ResumePoint {
    pub step: usize,
    /// This rank's running metrics at that point.
    pub loss_sum: f32,
    pub correct: f32,
    pub train_seconds: f64,
    /// Samples of the epoch's order visited, and by how many replicas.
    pub visited: (u64, u64),
}

impl ResumePoint {
    pub fn of(start: &Start) -> Self {
        Self {
            step: start.position.step as usize,
            loss_sum: start.epoch_loss_sum,
            correct: start.epoch_correct,
            train_seconds: start.epoch_train_seconds,
            visited: start.epoch_visited,
        }
    }
}

/// One rank's share of an epoch's running numbers, carried from one
/// generation of a live job to the next.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EpochShare {
    pub epoch: u64,
    pub loss_sum: f32,
    pub correct: f32,
    pub images: u64,
}

pub(super) struct EpochMeter<B: Ops> {
    /// Device accumulators: `[loss_sum]` and `[correct]` (the model's
    /// metric summed; correct predictions for accuracy).
    pub loss_sum: B::Storage<f32>,
    pub correct: B::Storage<f32>,
    /// The test pass's metric, summed on the device.
    pub test_sum: B::Storage<f32>,
    pub images: u64,
    /// Samples of the epoch's shuffled order visited so far, over all
    /// replicas (and layouts, in a resumed epoch).
    pub visited: u64,
    started: Instant,
    seconds_before: f64,
    paused: Duration,
}

impl<B: Ops> EpochMeter<B> {
    pub fn new(backend: &B) -> anyhow::Result<Self> {
        Ok(Self {
            loss_sum: backend.zeros(1)?,
            correct: backend.zeros(1)?,
            test_sum: backend.zeros(1)?,
            images: 0,
            visited: 0,
            started: Instant::now(),
            seconds_before: 0.0,
            paused: Duration::ZERO,
        })
    }

    /// Starts an epoch from scratch, or from `point` with `images` seen.
    pub fn start(
        &mut self,
        backend: &B,
        point: Option<&ResumePoint>,
        images: u64,
    ) -> anyhow::Result<()> {
        let (loss_sum, correct, seconds) = point.map_or((0.0, 0.0, 0.0), |p| {
            (p.loss_sum, p.correct, p.train_seconds)
        });
        backend.fill(&mut self.loss_sum, loss_sum)?;
        backend.fill(&mut self.correct, correct)?;
        self.images = images;
        self.visited = point.map_or(0, |p| p.visited.0);
        self.seconds_before = seconds;
        self.paused = Duration::ZERO;
        self.started = Instant::now();
        Ok(())
    }

    /// Leaves the time `since` took out of the training time.
    pub fn pause_since(&mut self, since: Instant) {
        self.paused += since.elapsed();
    }

    /// Training seconds of the epoch so far.
    pub fn train_seconds(&self) -> f64 {
        self.seconds_before
            + self
                .started
                .elapsed()
                .saturating_sub(self.paused)
                .as_secs_f64()
    }

    /// Goes on from `share` (this rank's numbers in another generation).
    pub fn carry(&mut self, backend: &B, share: &EpochShare) -> anyhow::Result<()> {
        backend.fill(&mut self.loss_sum, share.loss_sum)?;
        backend.fill(&mut self.correct, share.correct)?;
        self.images = share.images;
        Ok(())
    }

    /// This rank's `[loss_sum, correct]` so far.
    pub fn read(&self, backend: &B) -> anyhow::Result<[f64; 2]> {
        Ok([
            read_scalar(backend, &self.loss_sum)?,
            read_scalar(backend, &self.correct)?,
        ])
    }
}

/// The first value of `storage` (a synchronising read on a device).
pub(super) fn read_scalar<B: Ops>(backend: &B, storage: &B::Storage<f32>) -> anyhow::Result<f64> {
    let mut value = [0.0f32];
    backend.read_range(storage, 0..1, &mut value)?;
    Ok(f64::from(value[0]))
}
