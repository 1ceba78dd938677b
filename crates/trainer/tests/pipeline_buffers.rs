//! A pipeline stage allocates the activation buffers of its own layers
//! and of the cut between the stages, and no others: stage 0 the images,
//! the convolutions' outputs and the pooled activations, the last stage
//! the pooled activations, the fully connected layers' outputs and the
//! labels (with their gradients for training). The data-parallel network
//! still allocates every buffer once. The expected bytes come from the
//! layer geometry (the parameter layout and the image side).

use std::time::Duration;

use comm::LocalCommunicator;
use core_tensor::{Backend, Cpu};
use trainer::model::{CnnMnist, DropoutRates, IMAGE_SIDE, Model, NoSync, cnn_layout};
use trainer::pipeline::{HostLink, PipelinePlace, PipelineStage, stage_params};

/// A batch that does not split evenly into the micro-batches.
const BATCH: usize = 50;
const MICRO_BATCHES: usize = 4;
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

/// The bytes `model` allocates for its buffers of a batch of `BATCH`.
fn buffer_bytes<M: Model<Cpu>>(model: &M, train: bool) -> (usize, M::Buffers) {
    let cpu = Cpu::new(1).unwrap();
    let before = cpu.allocated_host_bytes().unwrap();
    let buffers = model.buffers(&cpu, BATCH, train).unwrap();
    let after = cpu.allocated_host_bytes().unwrap();
    ((after - before) as usize, buffers)
}

/// Both stages of one pipeline (their links unused: making buffers sends
/// nothing).
fn stages() -> Vec<PipelineStage<Cpu>> {
    LocalCommunicator::job(2, Duration::from_secs(30))
        .into_iter()
        .enumerate()
        .map(|(rank, comm)| {
            let place = PipelinePlace::of(rank, 2, 2).unwrap();
            let link = Box::new(HostLink::new(Box::new(comm)));
            let cnn = CnnMnist::new(DropoutRates::REFERENCE);
            PipelineStage::new(cnn, place, MICRO_BATCHES, link).unwrap()
        })
        .collect()
}

#[test]
fn a_stage_allocates_its_own_layers_activations_only() {
    let s = per_sample();
    let [front, back]: [PipelineStage<Cpu>; 2] = stages().try_into().ok().unwrap();
    // Stage 0: the images, conv1's and conv2's outputs, the pooled values;
    // for training each but the images with its gradient, and the scratch
    // of one micro-batch's gradients of the stage's parameters.
    let front_eval = F32 * (s.image + s.a1 + s.a2 + s.pooled);
    let front_train = F32 * (s.image + 2 * (s.a1 + s.a2 + s.pooled));
    let front_grads = F32 * stage_params(0).len();
    assert_eq!(buffer_bytes(&front, false).0, BATCH * front_eval);
    assert_eq!(
        buffer_bytes(&front, true).0,
        BATCH * front_train + front_grads
    );
    // The last stage: the pooled values, fc1's and fc2's outputs, a byte
    // per label; for training their gradients, the scratch of the stage's
    // parameter gradients and its loss sum.
    let back_eval = 1 + F32 * (s.pooled + s.hidden + s.logits);
    let back_train = 1 + F32 * 2 * (s.pooled + s.hidden + s.logits);
    let back_grads = F32 * (stage_params(1).len() + 1);
    assert_eq!(buffer_bytes(&back, false).0, BATCH * back_eval);
    assert_eq!(buffer_bytes(&back, true).0, BATCH * back_train + back_grads);
    // The whole network (a data-parallel rank) holds each buffer once:
    // both stages' but the cut, which each stage holds a copy of.
    let whole = CnnMnist::new(DropoutRates::REFERENCE);
    let cut = F32 * s.pooled;
    assert_eq!(
        buffer_bytes(&whole, false).0,
        BATCH * (front_eval + back_eval - cut)
    );
    assert_eq!(
        buffer_bytes(&whole, true).0,
        BATCH * (front_train + back_train - 2 * cut)
    );
}

/// Evaluation buffers have no gradients: a training pass over them is an
/// error that says so, on either stage, never a panic.
#[test]
fn training_over_evaluation_buffers_is_an_error() {
    let cpu = Cpu::new(1).unwrap();
    for stage in stages() {
        let mut buffers = stage.buffers(&cpu, BATCH, false).unwrap();
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
