//! A pipeline stage allocates the activation buffers of its own layers
//! and of the cut between the stages, and no others: stage 0 the images,
//! the convolutions' outputs and the pooled activations, the last stage
//! the pooled activations, the fully connected layers' outputs and the
//! labels (with their gradients for training). And it allocates them only
//! for the micro-batches its 1F1B schedule has in flight, in slots the
//! micro-batches take in turn: two on stage 0, one on the last stage, per
//! micro-batch size; what each micro-batch keeps of its own (its images or
//! its labels and logits) is small. Stage 0 runs one backward at a time,
//! so its slots hold no gradients: one set per micro-batch size is lent
//! to the micro-batch whose backward runs. So a stage's training buffers shrink
//! as the micro-batches grow in number, where they used to hold the whole
//! batch at any `M`. The data-parallel network still allocates every
//! buffer once. The expected bytes come from the layer geometry (the
//! parameter layout and the image side).

use std::time::Duration;

use comm::LocalCommunicator;
use core_tensor::{Backend, Cpu};
use trainer::model::{DropoutRates, Mode, Model, NoSync};
use trainer::models::cnn::{BatchInputs, CnnMnist, IMAGE_SIDE, cnn_layout};
use trainer::pipeline::{HostLink, PipelinePlace, PipelineStage, stage_params};

/// A batch that splits evenly into 1, 2, 4 and 8 micro-batches.
const BATCH: usize = 64;
/// One that does not: 4 micro-batches of 13, 13, 12, 12; 8 of 7, 7, 6, …
const UNEVEN: usize = 50;
const F32: usize = size_of::<f32>();

/// Values per sample of each activation, from the layer geometry: a
/// convolution's channels are its bias's length, 3x3 kernels without
/// padding take 2 from the side, fc1's inputs are the pooled values.
struct PerSample {
    image: usize,
    a1: usize,
    a2: usize,
    pooled: usize,
    hidden: usize,
    logits: usize,
}

fn per_sample() -> PerSample {
    let len = |name: &str| cnn_layout().range(name).unwrap().len();
    let side = |shrink: usize| (IMAGE_SIDE - shrink).pow(2);
    PerSample {
        image: side(0),
        a1: len("conv1.bias") * side(2),
        a2: len("conv2.bias") * side(4),
        pooled: len("fc1.weight") / len("fc1.bias"),
        hidden: len("fc1.bias"),
        logits: len("fc2.bias"),
    }
}

/// A stage's bytes: per sample of the batch (its own inputs and outputs),
/// per sample of a slot (to evaluate, to train), per sample of a
/// micro-batch size (the gradients lent to its slots), per slot (the
/// placeholders of what micro-batches lend it: one value each) and the
/// training scratch.
struct StageBytes {
    own: usize,
    eval: usize,
    train: usize,
    lent: usize,
    placeholders: usize,
    scratch: usize,
}

impl StageBytes {
    /// Stage 0: its own images; in a slot conv1's and conv2's outputs and
    /// the pooled values; for training their gradients once per
    /// micro-batch size, and the scratch of one micro-batch's gradients of
    /// the stage's parameters.
    fn front() -> Self {
        let s = per_sample();
        let slot = F32 * (s.a1 + s.a2 + s.pooled);
        Self {
            own: F32 * s.image,
            eval: slot,
            train: slot,
            lent: slot,
            placeholders: F32,
            scratch: F32 * stage_params(0).len(),
        }
    }

    /// The last stage: its own labels (a byte each) and logits; in a slot
    /// the pooled values and fc1's outputs with their gradients and the
    /// logits' gradient; the scratch of the stage's parameter gradients
    /// and its loss sum.
    fn back() -> Self {
        let s = per_sample();
        Self {
            own: 1 + F32 * s.logits,
            eval: F32 * (s.pooled + s.hidden),
            train: F32 * (2 * (s.pooled + s.hidden) + s.logits),
            lent: 0,
            placeholders: 1 + F32,
            scratch: F32 * (stage_params(1).len() + 1),
        }
    }

    /// Training buffers for a batch of `batch` whose slots are of `slots`
    /// samples.
    fn training(&self, batch: usize, slots: &[usize]) -> usize {
        let held: usize = slots.iter().map(|n| n * self.train).sum();
        // Slots come size by size, so each size once:
        let mut sizes = slots.to_vec();
        sizes.dedup();
        let lent: usize = sizes.iter().map(|n| n * self.lent).sum();
        batch * self.own + held + lent + slots.len() * self.placeholders + self.scratch
    }

    /// Evaluation buffers: one slot for the whole batch.
    fn evaluation(&self, batch: usize) -> usize {
        batch * (self.own + self.eval) + self.placeholders
    }
}

/// The bytes `model` allocates for its buffers of a batch of `batch`.
fn buffer_bytes<M: Model<Cpu>>(model: &M, batch: usize, train: bool) -> usize {
    let cpu = Cpu::new(1).unwrap();
    let before = cpu.allocated_host_bytes().unwrap();
    let _buffers = model.buffers(&cpu, batch, train).unwrap();
    (cpu.allocated_host_bytes().unwrap() - before) as usize
}

/// Stage `rank` of a pipeline of `micro_batches` over `comm`.
fn stage(
    rank: usize,
    comm: LocalCommunicator,
    micro_batches: usize,
    dropout: DropoutRates,
) -> PipelineStage<Cpu> {
    let place = PipelinePlace::of(rank, 2, 2).unwrap();
    let link = Box::new(HostLink::new(Box::new(comm)));
    PipelineStage::new(CnnMnist::new(dropout), place, micro_batches, link).unwrap()
}

/// Both stages of one pipeline of `micro_batches` (their links unused:
/// making buffers sends nothing).
fn stages(micro_batches: usize) -> [PipelineStage<Cpu>; 2] {
    let stages: Vec<_> = LocalCommunicator::job(2, Duration::from_secs(30))
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| stage(rank, comm, micro_batches, DropoutRates::REFERENCE))
        .collect();
    stages.try_into().ok().unwrap()
}

#[test]
fn a_stage_holds_the_micro_batches_in_flight_only() {
    let (front, back) = (StageBytes::front(), StageBytes::back());
    let (mut held, mut expected) = (Vec::new(), Vec::new());
    for m in [1, 2, 4, 8] {
        let [first, last] = stages(m);
        let train = |stage: &PipelineStage<Cpu>| buffer_bytes(stage, BATCH, true);
        let eval = |stage: &PipelineStage<Cpu>| buffer_bytes(stage, BATCH, false);
        held.push((m, train(&first), train(&last), eval(&first), eval(&last)));
        // Stage 0: two slots (one for a single micro-batch); the last
        // stage: one. Evaluation goes through in one piece, whatever M.
        let micro = BATCH / m;
        expected.push((
            m,
            front.training(BATCH, &vec![micro; m.min(2)]),
            back.training(BATCH, &[micro]),
            front.evaluation(BATCH),
            back.evaluation(BATCH),
        ));
    }
    assert_eq!(
        held, expected,
        "(M, training and evaluation bytes of each stage)"
    );
    // More micro-batches, less memory: stage 0 from M = 2 on (until then
    // every micro-batch has its own slot), the last stage from M = 1 on.
    for pair in held.windows(2) {
        assert!(pair[1].2 < pair[0].2, "the last stage: {held:?}");
    }
    for pair in held[1..].windows(2) {
        assert!(pair[1].1 < pair[0].1, "stage 0: {held:?}");
    }
}

/// Slots serve one micro-batch size: a batch that M does not divide
/// splits into two sizes, each with its own slots.
#[test]
fn micro_batches_of_two_sizes_take_slots_of_each() {
    let (front, back) = (StageBytes::front(), StageBytes::back());
    let held = |m: usize| {
        let [first, last] = stages(m);
        (
            buffer_bytes(&first, UNEVEN, true),
            buffer_bytes(&last, UNEVEN, true),
        )
    };
    // 8 micro-batches: 7, 7, then six of 6.
    let expected = (
        front.training(UNEVEN, &[7, 7, 6, 6]),
        back.training(UNEVEN, &[7, 6]),
    );
    assert_eq!(held(8), expected, "M = 8");
    // 4: 13, 13, 12, 12, so stage 0 has a slot for each.
    let expected = (
        front.training(UNEVEN, &[13, 13, 12, 12]),
        back.training(UNEVEN, &[13, 12]),
    );
    assert_eq!(held(4), expected, "M = 4");
}

/// What one training step leaves: the gradients, the loss sum and the
/// correct count.
type Step = (Vec<f32>, f32, f32);

/// One training step of `model` (over parameters `params`, its part)
/// after `fill` wrote the batch into its buffers.
fn step<M: Model<Cpu>>(model: &M, params: &[f32], fill: impl FnOnce(&mut M::Buffers)) -> Step {
    let cpu = Cpu::new(1).unwrap();
    let mut buffers = model.buffers(&cpu, UNEVEN, true).unwrap();
    fill(&mut buffers);
    let mut grads = cpu.zeros(params.len()).unwrap();
    let params = cpu.upload(params).unwrap();
    let (mut loss, mut correct) = (cpu.zeros(1).unwrap(), cpu.zeros(1).unwrap());
    let mode = Mode::Train { dropout_seed: 1 };
    model.forward(&cpu, &mut buffers, &params, mode).unwrap();
    model.metric_sum(&cpu, &buffers, &mut correct).unwrap();
    model.loss(&cpu, &mut buffers, &mut loss).unwrap();
    model
        .backward(&cpu, &mut buffers, &params, &mut grads, 1, &mut NoSync)
        .unwrap();
    (grads, loss[0], correct[0])
}

/// `|a - b| / |b|`, over the vectors.
fn relative(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f32>| v.map(|x| f64::from(x).powi(2)).sum::<f64>();
    norm(&mut a.iter().zip(b).map(|(x, y)| x - y)).sqrt() / norm(&mut b.iter().copied()).sqrt()
}

/// Micro-batches of two sizes (50 in 8: 7, 7, then six of 6) go through
/// their slots as the batch goes through the whole network: the same
/// gradients of each stage's parameters, loss and correct count, within
/// the rounding of sums in another order (dropout off). A micro-batch in
/// another's slot, or its labels or logits lost, would be far off.
#[test]
fn micro_batches_of_two_sizes_train_as_the_whole_batch() {
    let cnn = CnnMnist::new(DropoutRates::OFF);
    let params = cnn.init_params(5);
    let pixels = IMAGE_SIDE * IMAGE_SIDE;
    let images: Vec<f32> = (0..UNEVEN * pixels)
        .map(|i| (i % 97) as f32 / 97.0)
        .collect();
    let labels: Vec<u8> = (0..UNEVEN).map(|i| (i * 7 % 10) as u8).collect();
    let cpu = Cpu::new(1).unwrap();
    let (grads, loss, correct) = step(&cnn, &params, |whole| {
        cpu.write_range(&images, &mut whole.features.x, 0).unwrap();
        cpu.write_range(&labels, &mut whole.head.labels, 0).unwrap();
    });
    let comms = LocalCommunicator::job(2, Duration::from_secs(30));
    let piped: Vec<Step> = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(rank, comm)| {
                let (params, images, labels, cpu) = (&params, &images, &labels, &cpu);
                s.spawn(move || {
                    let stage = stage(rank, comm, 8, DropoutRates::OFF);
                    step(&stage, &params[stage_params(rank)], |buffers| {
                        let mut at = 0;
                        for part in buffers.parts() {
                            let n = part.samples;
                            if let Some(x) = part.images {
                                let mine = &images[at * pixels..(at + n) * pixels];
                                cpu.write_range(mine, x, 0).unwrap();
                            }
                            if let Some(y) = part.labels {
                                cpu.write_range(&labels[at..at + n], y, 0).unwrap();
                            }
                            at += n;
                        }
                    })
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    for (rank, (part, ..)) in piped.iter().enumerate() {
        let whole = &grads[stage_params(rank)];
        assert!(relative(part, whole) < 1e-5, "stage {rank}");
    }
    let (_, last_loss, last_correct) = piped[1];
    assert!(
        (last_loss - loss).abs() <= 1e-5 * loss,
        "{last_loss} {loss}"
    );
    assert_eq!(last_correct, correct);
}

/// The whole network (a data-parallel rank) holds each buffer once, for
/// the whole batch: both stages' but the cut (with its gradient for
/// training), which each stage holds a copy of.
#[test]
fn the_whole_network_holds_every_buffer_once() {
    let s = per_sample();
    let (front, back) = (StageBytes::front(), StageBytes::back());
    let whole = CnnMnist::new(DropoutRates::REFERENCE);
    let cut = F32 * s.pooled;
    let eval = front.own + front.eval + back.own + back.eval - cut;
    assert_eq!(buffer_bytes(&whole, BATCH, false), BATCH * eval);
    let front_train = front.own + front.train + front.lent;
    let train = front_train + back.own + back.train - 2 * cut;
    assert_eq!(buffer_bytes(&whole, BATCH, true), BATCH * train);
}

/// Evaluation buffers have no gradients: a training pass over them is an
/// error that says so, on either stage, never a panic.
#[test]
fn training_over_evaluation_buffers_is_an_error() {
    let cpu = Cpu::new(1).unwrap();
    for stage in stages(4) {
        let mut buffers = stage.buffers(&cpu, UNEVEN, false).unwrap();
        let mut grads = cpu.zeros(stage_params(stage.place().stage).len()).unwrap();
        let params = cpu.zeros(1).unwrap();
        let err = stage
            .backward(&cpu, &mut buffers, &params, &mut grads, 0, &mut NoSync)
            .unwrap_err();
        assert!(
            format!("{err:#}").contains("buffers built for training"),
            "{err:#}"
        );
    }
}
