//! A pipeline stage allocates the buffers of its own segments and of the
//! cuts around them, and no others, only for the micro-batches its 1F1B
//! schedule has in flight (in slots the micro-batches take in turn: two on
//! stage 0 of 2, one on the last stage, per micro-batch size), and the
//! gradients of its cuts once per micro-batch size, since it runs one
//! backward at a time. So a stage's training buffers shrink as the
//! micro-batches grow in number. The whole network holds every buffer
//! once. The expected bytes come from the layer geometry (the parameter
//! layout and the image side), here for the CNN cut between its
//! convolutions and its fully connected layers.

use core_tensor::{Backend, Cpu};

use super::*;
use crate::model::DropoutRates;
use crate::models::cnn::{CnnMnist, IMAGE_SIDE, cnn_layout};

/// A batch that splits evenly into 1, 2, 4 and 8 micro-batches.
const BATCH: usize = 64;
/// One that does not: 8 micro-batches of 7, 7, then six of 6.
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

/// A stage's bytes per sample: of its micro-batches' own (inputs or
/// labels), of a slot for evaluation and for training, and of the
/// gradients of its cuts (once per micro-batch size).
struct Bytes {
    own: usize,
    eval: usize,
    train: usize,
    cut_grads: usize,
}

impl Bytes {
    /// Stage 0 (conv1, conv2): its images; in a slot conv1's output,
    /// conv2's (with its gradient for training) and the pooled values;
    /// the gradients of conv1's output and of the pooled values.
    fn front() -> Self {
        let s = per_sample();
        Self {
            own: F32 * s.image,
            eval: F32 * (s.a1 + s.a2 + s.pooled),
            train: F32 * (s.a1 + 2 * s.a2 + s.pooled),
            cut_grads: F32 * (s.a1 + s.pooled),
        }
    }

    /// The last stage (fc1, fc2): its labels (a byte each); in a slot the
    /// pooled values it receives, fc1's output and the logits; the
    /// gradients of those three.
    fn back() -> Self {
        let s = per_sample();
        let slot = F32 * (s.pooled + s.hidden + s.logits);
        Self {
            own: 1,
            eval: slot,
            train: slot,
            cut_grads: slot,
        }
    }

    /// Training buffers for a batch of `batch` whose slots are of `slots`
    /// samples and whose micro-batches are of `sizes`.
    fn training(&self, batch: usize, slots: &[usize], sizes: &[usize]) -> usize {
        let held: usize = slots.iter().map(|n| n * self.train).sum();
        batch * self.own + held + sizes.iter().map(|n| n * self.cut_grads).sum::<usize>()
    }

    /// Evaluation buffers: one slot for the whole batch.
    fn evaluation(&self, batch: usize) -> usize {
        batch * (self.own + self.eval)
    }
}

/// Stage `stage` of the CNN cut between its convolutions and its fully
/// connected layers.
fn at(stage: usize) -> StageAt {
    StageAt {
        segments: [0..2, 2..4][stage].clone(),
        first: stage == 0,
        last: stage == 1,
        in_flight: 2 - stage,
    }
}

/// The bytes stage `stage`'s buffers take for micro-batches of `sizes`.
fn stage_bytes(stage: usize, sizes: &[usize], train: bool) -> usize {
    let cpu = Cpu::new(1).unwrap();
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let before = cpu.allocated_host_bytes().unwrap();
    let _buffers = StageBuffers::new(&model, &cpu, (&at(stage), sizes), train).unwrap();
    (cpu.allocated_host_bytes().unwrap() - before) as usize
}

#[test]
fn a_stage_holds_the_micro_batches_in_flight_only() {
    let (front, back) = (Bytes::front(), Bytes::back());
    let (mut held, mut expected) = (Vec::new(), Vec::new());
    for m in [1, 2, 4, 8] {
        let sizes = vec![BATCH / m; m];
        let micro = BATCH / m;
        held.push((
            m,
            stage_bytes(0, &sizes, true),
            stage_bytes(1, &sizes, true),
            stage_bytes(0, &[BATCH], false),
            stage_bytes(1, &[BATCH], false),
        ));
        // Stage 0: two slots (one for a single micro-batch); the last
        // stage: one. Evaluation goes through in one piece, whatever M.
        expected.push((
            m,
            front.training(BATCH, &vec![micro; m.min(2)], &[micro]),
            back.training(BATCH, &[micro], &[micro]),
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
/// splits into two sizes, each with its own slots and cut gradients.
#[test]
fn micro_batches_of_two_sizes_take_slots_of_each() {
    let (front, back) = (Bytes::front(), Bytes::back());
    let sizes = [7, 7, 6, 6, 6, 6, 6, 6];
    assert_eq!(
        stage_bytes(0, &sizes, true),
        front.training(UNEVEN, &[7, 7, 6, 6], &[7, 6])
    );
    assert_eq!(
        stage_bytes(1, &sizes, true),
        back.training(UNEVEN, &[7, 6], &[7, 6])
    );
}

/// The whole network (a data-parallel rank) holds each buffer once, for
/// the whole batch: the cuts with their gradients, conv2's output and its
/// gradient, and the labels.
#[test]
fn the_whole_network_holds_every_buffer_once() {
    let s = per_sample();
    let cpu = Cpu::new(1).unwrap();
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let bytes = |train| {
        let before = cpu.allocated_host_bytes().unwrap();
        let _chain = crate::model::Model::buffers(&model, &cpu, BATCH, train).unwrap();
        (cpu.allocated_host_bytes().unwrap() - before) as usize
    };
    let eval = F32 * (s.image + s.a1 + s.a2 + s.pooled + s.hidden + s.logits) + 1;
    assert_eq!(bytes(false), BATCH * eval);
    let grads = F32 * (s.a1 + s.a2 + s.pooled + s.hidden + s.logits);
    assert_eq!(bytes(true), BATCH * (eval + grads));
}

/// Evaluation buffers have no gradients: a schedule that asks for them
/// gets an error that says so, never a panic.
#[test]
fn evaluation_buffers_have_no_gradients_to_lend() {
    let cpu = Cpu::new(1).unwrap();
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    for stage in 0..2 {
        let mut buffers = StageBuffers::new(&model, &cpu, (&at(stage), &[UNEVEN]), false).unwrap();
        let err = buffers.grads_of(0).err().unwrap();
        assert!(
            format!("{err:#}").contains("buffers built for training"),
            "{err:#}"
        );
    }
}
