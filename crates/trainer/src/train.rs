//! The training loop of one rank: a full replica of the model, its shard of
//! the data, and (for more than one rank) gradient averaging every step.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use core_tensor::ops::{AdamConfig, ClassGeom, GUARD_CLEAR, GUARD_LEN, GuardState};
use core_tensor::{Ops, rng};
use fashion_mnist::FashionMnist;
use sampler::{DistributedSampler, SamplerConfig};

use crate::checkpoint::origin::{self, Origin};
use crate::checkpoint::{Checkpoints, Position, Settings, TrainingState};
use crate::data::{DeviceSplit, to_device_indices};
use crate::ddp::{CommThread, DeviceAverager, HostAverager};
use crate::model::{Activations, CLASSES, CnnMnist, DropoutRates, GradsReady, Mode};

/// What the loop needs to know, shared by every rank.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub epochs: usize,
    /// Samples per step on each rank.
    pub batch_size: usize,
    pub adam: AdamConfig,
    pub seed: u64,
    /// A cap on the steps of each epoch, for quick runs.
    pub max_steps: Option<usize>,
    pub dropout: DropoutRates,
    pub bucket_mb: f64,
}

impl TrainConfig {
    /// What a checkpoint records of this configuration.
    pub fn settings(&self, world_size: usize) -> Settings {
        Settings {
            seed: self.seed,
            world_size,
            batch_size: self.batch_size,
            lr: self.adam.lr,
            dropout: self.dropout,
        }
    }
}

/// On a device whose reads synchronise, the guard is read every this many
/// steps (and at every epoch end and checkpoint).
const GUARD_READ_EVERY: u64 = 100;

/// Batch size of the (dropout-free) test-set pass; only memory depends on it.
const EVAL_BATCH: usize = 256;

/// One epoch's numbers, already reduced over all ranks.
#[derive(Clone, Debug, PartialEq)]
pub struct EpochReport {
    pub epoch: usize,
    pub epochs: usize,
    /// Mean training loss per sample.
    pub loss: f64,
    pub accuracy: f64,
    pub test_accuracy: f64,
    /// Seconds spent training (evaluation excluded).
    pub train_seconds: f64,
    /// Training images per second, all ranks together.
    pub images_per_second: f64,
    pub steps: usize,
    pub images: u64,
}

/// Per-step progress, for a progress bar.
pub trait Progress {
    fn start_epoch(&mut self, epoch: usize, steps: usize);
    fn step(&mut self);
    fn finish_epoch(&mut self);
}

/// No progress display (other ranks, non-terminal output, tests).
pub struct Silent;
impl Progress for Silent {
    fn start_epoch(&mut self, _: usize, _: usize) {}
    fn step(&mut self) {}
    fn finish_epoch(&mut self) {}
}

/// The hook used when there is nothing to synchronise (one rank).
struct LocalOnly;
impl<B: Ops> GradsReady<B> for LocalOnly {
    fn ready(&mut self, _: &B, _: &mut B::Storage<f32>, _: usize) -> anyhow::Result<()> {
        Ok(())
    }
}

/// How gradients are averaged over the ranks.
enum GradPath<B: Ops> {
    /// One rank: nothing to average.
    Local,
    /// Through the host communicator.
    Host(HostAverager),
    /// On the device (NCCL).
    Device(Box<dyn DeviceAverager<B>>),
}

/// A point inside an epoch to continue from (a mid-epoch checkpoint).
struct ResumePoint {
    step: usize,
    /// This rank's running metrics at that point.
    loss_sum: f32,
    correct: f32,
    train_seconds: f64,
}

/// One rank's replica and optimizer state.
pub struct Trainer<B: Ops> {
    /// First, so it is dropped first: a device averager makes the compute
    /// stream wait for its collectives before the gradients are freed.
    grad_path: GradPath<B>,
    /// The host communicator (metrics, the starting state, and gradients
    /// on the host path); `None` for one rank.
    comm: Option<CommThread>,
    backend: B,
    model: CnnMnist,
    cfg: TrainConfig,
    rank: usize,
    world_size: usize,
    params: B::Storage<f32>,
    grads: B::Storage<f32>,
    adam_m: B::Storage<f32>,
    adam_v: B::Storage<f32>,
    /// Adam updates done so far.
    step: u64,
    train: DeviceSplit<B>,
    test: DeviceSplit<B>,
    /// Buffers per batch size (the full batch, the last partial one, eval).
    activations: HashMap<(usize, bool), Activations<B>>,
    /// Device accumulators: `[loss_sum]` and `[correct]`.
    loss_sum: B::Storage<f32>,
    correct: B::Storage<f32>,
    /// The epoch training starts in, and where inside it (if not at step 0).
    first_epoch: usize,
    resume_at: Option<ResumePoint>,
    checkpoints: Option<Checkpoints>,
    /// The finiteness guard in front of Adam (`ops::finite`).
    guard: B::Storage<u32>,
}

impl<B: Ops> Trainer<B> {
    /// Builds a fresh replica (every rank starts from rank 0's seeded
    /// parameters).
    pub fn new(
        backend: B,
        data: &FashionMnist,
        cfg: TrainConfig,
        comm: Option<CommThread>,
    ) -> anyhow::Result<Self> {
        Self::with_origin(backend, data, cfg, comm, Origin::Fresh)
    }

    /// Builds the replica from rank 0's `origin` (ignored on other ranks,
    /// which receive rank 0's).
    pub fn with_origin(
        backend: B,
        data: &FashionMnist,
        cfg: TrainConfig,
        mut comm: Option<CommThread>,
        origin: Origin,
    ) -> anyhow::Result<Self> {
        if cfg.batch_size == 0 || cfg.epochs == 0 {
            bail!("the batch size and the number of epochs must be at least 1");
        }
        cfg.adam.validate()?;
        let model = CnnMnist::new(cfg.dropout);
        let (rank, world_size) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
        let start = origin::agree(
            origin,
            comm.as_mut(),
            || model.init_params(cfg.seed),
            model.layout().len(),
            cfg.seed,
            cfg.batch_size,
        )
        .with_context(|| format!("rank {rank}: agreeing on the starting point"))?;
        let grad_path = match &comm {
            Some(_) => GradPath::Host(HostAverager::new(&backend, model.layout(), cfg.bucket_mb)?),
            None => GradPath::Local,
        };
        let n = model.layout().len();
        let resume_at = (start.position.step > 0).then_some(ResumePoint {
            step: start.position.step as usize,
            loss_sum: start.epoch_loss_sum,
            correct: start.epoch_correct,
            train_seconds: start.epoch_train_seconds,
        });
        Ok(Self {
            params: backend.upload(&start.params)?,
            grads: backend.zeros(n)?,
            adam_m: backend.upload(&start.exp_avg)?,
            adam_v: backend.upload(&start.exp_avg_sq)?,
            step: start.optimizer_step,
            first_epoch: start.position.epoch as usize,
            resume_at,
            checkpoints: None,
            guard: backend.upload(&GUARD_CLEAR)?,
            train: DeviceSplit::upload(&backend, &data.train, "training")?,
            test: DeviceSplit::upload(&backend, &data.test, "test")?,
            activations: HashMap::new(),
            loss_sum: backend.zeros(1)?,
            correct: backend.zeros(1)?,
            grad_path,
            comm,
            backend,
            model,
            cfg,
            rank,
            world_size,
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn model(&self) -> &CnnMnist {
        &self.model
    }

    /// The epoch this replica starts (or resumes) in.
    pub fn first_epoch(&self) -> usize {
        self.first_epoch
    }

    /// Averages gradients with `averager` on the device instead of through
    /// the host communicator (which still carries metrics).
    pub fn average_on_device(&mut self, averager: Box<dyn DeviceAverager<B>>) {
        self.grad_path = GradPath::Device(averager);
    }

    /// Turns on checkpoints (on every rank: mid-epoch ones are collective).
    pub fn set_checkpoints(&mut self, checkpoints: Checkpoints) {
        self.checkpoints = Some(checkpoints);
    }

    /// Trains from where this replica starts through epoch `cfg.epochs`,
    /// handing each epoch's report to `on_epoch`, then checkpointing.
    pub fn run(
        &mut self,
        progress: &mut dyn Progress,
        on_epoch: &mut dyn FnMut(&EpochReport) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        for epoch in self.first_epoch..=self.cfg.epochs {
            let report = self.train_epoch(epoch, progress, &mut |_| Ok(()))?;
            on_epoch(&report)?;
            if self.checkpoints.is_some() {
                self.save_checkpoint(
                    Position {
                        epoch: epoch as u64 + 1,
                        step: 0,
                    },
                    0.0,
                )?;
            }
        }
        Ok(())
    }

    /// The parameters, copied to the host.
    pub fn params(&self) -> anyhow::Result<Vec<f32>> {
        Ok(self.backend.download(&self.params)?)
    }

    /// This rank's sampler for the training split.
    pub fn sampler(&self) -> anyhow::Result<DistributedSampler> {
        let config = SamplerConfig {
            num_replicas: self.world_size,
            rank: self.rank,
            shuffle: true,
            seed: self.cfg.seed,
            drop_last: false,
        };
        Ok(DistributedSampler::new(self.train.len, config)?)
    }

    /// Trains one epoch (numbered from 1) and evaluates on the test set; a
    /// replica resumed mid-epoch continues its first epoch where it stopped.
    pub fn train_epoch(
        &mut self,
        epoch: usize,
        progress: &mut dyn Progress,
        after_step: &mut dyn FnMut(&Self) -> anyhow::Result<()>,
    ) -> anyhow::Result<EpochReport> {
        let resumed = match self.resume_at.take() {
            Some(point) if epoch == self.first_epoch => Some(point),
            Some(_) => bail!(
                "rank {}: asked to train epoch {epoch}, but this run resumes in epoch {}",
                self.rank,
                self.first_epoch
            ),
            None => None,
        };
        let mut sampler = self.sampler()?;
        sampler.set_epoch(epoch as u64 - 1);
        let indices = sampler.indices();
        let device_indices = to_device_indices(&self.backend, &indices)?;
        let batch = self.cfg.batch_size;
        let steps = indices
            .len()
            .div_ceil(batch)
            .min(self.cfg.max_steps.unwrap_or(usize::MAX));
        let (first, loss_sum, correct, seconds_before) = resumed.map_or((0, 0.0, 0.0, 0.0), |p| {
            (p.step, p.loss_sum, p.correct, p.train_seconds)
        });
        if first > steps {
            bail!(
                "rank {}: the checkpoint is at step {first} of epoch {epoch}, but this run's epochs have {steps} steps (another --max-steps?)",
                self.rank
            );
        }
        self.backend.fill(&mut self.loss_sum, loss_sum)?;
        self.backend.fill(&mut self.correct, correct)?;
        progress.start_epoch(epoch, steps - first);
        let started = Instant::now();
        let mut saving = Duration::ZERO;
        let training_seconds = |saving: Duration| {
            seconds_before + started.elapsed().saturating_sub(saving).as_secs_f64()
        };
        let mut images = (first * batch).min(indices.len()) as u64;
        for s in first..steps {
            let positions = s * batch..((s + 1) * batch).min(indices.len());
            images += positions.len() as u64;
            let seed = rng::derive_seed(self.cfg.seed, &[self.rank as u64, epoch as u64, s as u64]);
            self.train_step(&device_indices, positions, seed)
                .with_context(|| format!("rank {}: epoch {epoch}, step {}", self.rank, s + 1))?;
            progress.step();
            // The epoch's last step is followed by the end-of-epoch checkpoint.
            if s + 1 < steps
                && self
                    .checkpoints
                    .as_ref()
                    .and_then(|c| c.every)
                    .is_some_and(|n| self.step % n == 0)
            {
                let began = Instant::now();
                self.save_checkpoint(
                    Position {
                        epoch: epoch as u64,
                        step: s as u64 + 1,
                    },
                    training_seconds(saving),
                )?;
                saving += began.elapsed();
            }
            after_step(self)?;
        }
        self.check_guard()
            .with_context(|| format!("rank {}: end of epoch {epoch}", self.rank))?;
        let local = [
            self.download_scalar(&self.loss_sum)?,
            self.download_scalar(&self.correct)?,
            images as f64,
        ];
        let [loss_sum, correct, images] = self.sum_over_ranks(local.to_vec())?[..] else {
            unreachable!("three values in, three out")
        };
        let train_seconds = training_seconds(saving);
        progress.finish_epoch();
        let test_accuracy = self.evaluate()?;
        Ok(EpochReport {
            epoch,
            epochs: self.cfg.epochs,
            loss: loss_sum / images,
            accuracy: correct / images,
            test_accuracy,
            train_seconds,
            images_per_second: images / train_seconds,
            steps,
            images: images as u64,
        })
    }

    /// One optimizer step on the samples `indices[positions]`.
    fn train_step(
        &mut self,
        indices: &B::Storage<u32>,
        positions: std::ops::Range<usize>,
        dropout_seed: u64,
    ) -> anyhow::Result<()> {
        let n = positions.len();
        let geom = ClassGeom {
            batch: n,
            classes: CLASSES,
        };
        let mut act = self
            .activations
            .remove(&(n, true))
            .map_or_else(|| Activations::new(&self.backend, n, true), Ok)?;
        let b = &self.backend;
        self.train
            .gather(b, indices, positions, &mut act.x, &mut act.labels)?;
        self.model
            .forward(b, &mut act, &self.params, Mode::Train { dropout_seed })?;
        b.count_correct(&geom, &act.logits, &act.labels, &mut self.correct)?;
        let dlogits = &mut act
            .grads
            .as_mut()
            .context("training activations have gradients")?
            .dlogits;
        b.cross_entropy_fwd_bwd(&geom, &act.logits, &act.labels, dlogits, &mut self.loss_sum)?;
        let (model, params, grads) = (&self.model, &self.params, &mut self.grads);
        match &mut self.grad_path {
            GradPath::Local => {
                model.backward(b, &mut act, params, grads, dropout_seed, &mut LocalOnly)?;
            }
            GradPath::Host(averager) => {
                let comm = self
                    .comm
                    .as_mut()
                    .context("the host gradient path needs a communicator")?;
                let mut hook = averager.hook(comm);
                model.backward(b, &mut act, params, grads, dropout_seed, &mut hook)?;
                averager.finish(comm, b, grads)?;
            }
            GradPath::Device(averager) => {
                model.backward(b, &mut act, params, grads, dropout_seed, averager.as_mut())?;
                averager.finish(b)?;
            }
        }
        self.activations.insert((n, true), act);
        self.step += 1;
        let step = u32::try_from(self.step).unwrap_or(u32::MAX);
        b.guard_finite(step, &self.loss_sum, &self.grads, &mut self.guard)?;
        let scalars = self.cfg.adam.scalars(self.step);
        self.backend.adam_step(
            &scalars,
            &mut self.params,
            &self.grads,
            &mut self.adam_m,
            &mut self.adam_v,
            &self.guard,
        )?;
        // On a GPU reading the guard waits for the device: only now and then.
        if B::IN_HOST_MEMORY || self.step % GUARD_READ_EVERY == 0 {
            self.check_guard()?;
        }
        Ok(())
    }

    /// Stops once the guard saw a non-finite loss or gradient. The guard
    /// skips the Adam update of that step and every later one on the
    /// device, so the parameters (and any checkpoint) stay those from before
    /// it; this only reports it, naming the step and the parameter. The
    /// loss is the epoch's running sum: non-finite from the first bad step
    /// on. With several ranks the gradients are already averaged, so every
    /// rank stops at the same step.
    ///
    /// Reading the guard waits for the device, so every collective queued
    /// before has completed or been aborted by then: a failed one is
    /// reported first (the gradients it left are not to be trusted).
    fn check_guard(&self) -> anyhow::Result<()> {
        let mut words = [0u32; GUARD_LEN];
        self.backend
            .read_range(&self.guard, 0..GUARD_LEN, &mut words)?;
        if let GradPath::Device(averager) = &self.grad_path {
            averager.check()?;
        }
        let GuardState::Tripped { step, index } = GuardState::from_words(words) else {
            return Ok(());
        };
        let what = match index {
            Some(i) => {
                let views = self.model.layout().views();
                let name = views.iter().find(|v| v.range.contains(&i));
                format!("gradient in {}", name.map_or("?", |v| v.spec.name.as_str()))
            }
            None => "loss".to_string(),
        };
        if u64::from(step) == self.step {
            bail!("non-finite {what}; stopped before applying this step");
        }
        bail!(
            "non-finite {what} at optimizer step {step} (noticed at step {}); that update and \
             every one after it were skipped, so the parameters are those from before it",
            self.step
        );
    }

    /// Checkpoints at `position`. Every rank calls it (mid-epoch, the
    /// ranks' running metrics are gathered); rank 0 writes.
    fn save_checkpoint(&mut self, position: Position, train_seconds: f64) -> anyhow::Result<()> {
        self.check_guard()
            .with_context(|| format!("rank {}: before checkpointing at {position}", self.rank))?;
        let (epoch_loss_sum, epoch_correct) = if position.step == 0 {
            (vec![0.0; self.world_size], vec![0.0; self.world_size])
        } else {
            self.gather_epoch_metrics()?
        };
        let Some(checkpoints) = self.checkpoints.as_ref().filter(|_| self.rank == 0) else {
            return Ok(());
        };
        let state = TrainingState {
            position,
            optimizer_step: self.step,
            params: self.backend.download(&self.params)?,
            exp_avg: self.backend.download(&self.adam_m)?,
            exp_avg_sq: self.backend.download(&self.adam_v)?,
            epoch_loss_sum,
            epoch_correct,
            epoch_train_seconds: train_seconds,
            settings: self.cfg.settings(self.world_size),
        };
        checkpoints
            .dir
            .save(&state, self.model.layout())
            .with_context(|| format!("rank 0: checkpointing at {position}"))?;
        Ok(())
    }

    /// Every rank's running loss sum and correct count, exactly: each rank
    /// fills its own slots, and f32 → f64 → f32 plus zeros loses nothing.
    fn gather_epoch_metrics(&mut self) -> anyhow::Result<(Vec<f32>, Vec<f32>)> {
        let n = self.world_size;
        let mut mine = vec![0.0; 2 * n];
        mine[self.rank] = self.download_scalar(&self.loss_sum)?;
        mine[n + self.rank] = self.download_scalar(&self.correct)?;
        let all = self.sum_over_ranks(mine)?;
        Ok((
            all[..n].iter().map(|&x| x as f32).collect(),
            all[n..].iter().map(|&x| x as f32).collect(),
        ))
    }

    /// Test-set accuracy, each rank evaluating every `world_size`-th sample.
    pub fn evaluate(&mut self) -> anyhow::Result<f64> {
        let mine: Vec<usize> = (self.rank..self.test.len)
            .step_by(self.world_size)
            .collect();
        let indices = to_device_indices(&self.backend, &mine)?;
        self.backend.fill(&mut self.correct, 0.0)?;
        for start in (0..mine.len()).step_by(EVAL_BATCH) {
            let positions = start..(start + EVAL_BATCH).min(mine.len());
            let n = positions.len();
            let mut act = self
                .activations
                .remove(&(n, false))
                .map_or_else(|| Activations::new(&self.backend, n, false), Ok)?;
            self.test.gather(
                &self.backend,
                &indices,
                positions,
                &mut act.x,
                &mut act.labels,
            )?;
            self.model
                .forward(&self.backend, &mut act, &self.params, Mode::Eval)?;
            let geom = ClassGeom {
                batch: n,
                classes: CLASSES,
            };
            self.backend
                .count_correct(&geom, &act.logits, &act.labels, &mut self.correct)?;
            self.activations.insert((n, false), act);
        }
        let local = vec![self.download_scalar(&self.correct)?, mine.len() as f64];
        let total = self.sum_over_ranks(local)?;
        Ok(total[0] / total[1])
    }

    fn download_scalar(&self, storage: &B::Storage<f32>) -> anyhow::Result<f64> {
        let mut value = [0.0f32];
        self.backend.read_range(storage, 0..1, &mut value)?;
        Ok(f64::from(value[0]))
    }

    fn sum_over_ranks(&mut self, values: Vec<f64>) -> anyhow::Result<Vec<f64>> {
        match &mut self.comm {
            Some(comm) => comm.sum_f64(values).context("reducing epoch metrics"),
            None => Ok(values),
        }
    }
}
