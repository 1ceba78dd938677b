//! Our checkpoints are PyTorch's format: PyTorch's classic CNN_MNIST loads a
//! checkpoint's `model.safetensors` with `load_state_dict(strict=True)` and
//! computes the same logits as our forward pass; and weights PyTorch saved
//! load through `--init-from`'s loader and give PyTorch's logits here.
//!
//! Needs Python with torch and safetensors: `TORCH_PYTHON`, else `python3`.
//! Without them the test says so and passes, unless REQUIRE_TORCH=1 (as in
//! CI), which turns the skip into a failure.

mod common;

use std::path::Path;
use std::process::Command;

use common::python_with;
use core_tensor::{Backend, Cpu};
use safetensors::{Dtype, SafeTensors};
use trainer::checkpoint::{
    CheckpointDir, MODEL_FILE, Position, Settings, TrainingState, load_weights,
};
use trainer::model::{DropoutRates, Mode, Model};
use trainer::models::cnn::{Activations, CnnMnist, IMAGE_SIDE};

const BATCH: usize = 8;

/// A fixed batch: pixel values spread over [0, 1), as the model sees them.
fn batch() -> Vec<f32> {
    (0..BATCH * IMAGE_SIDE * IMAGE_SIDE)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0)
        .collect()
}

fn our_logits(model: &CnnMnist, params: &[f32], x: &[f32]) -> Vec<f32> {
    let b = Cpu::new(1).unwrap();
    let mut act: Activations<Cpu> = model.buffers(&b, BATCH, false).unwrap();
    b.write_range(x, &mut act.cuts[0], 0).unwrap();
    model
        .forward(&b, &mut act, &b.upload(params).unwrap(), Mode::Eval)
        .unwrap();
    b.download(act.cuts.last().unwrap()).unwrap()
}

fn write_f32(path: &Path, name: &str, shape: Vec<usize>, values: &[f32]) {
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let view = safetensors::tensor::TensorView::new(Dtype::F32, shape, &bytes).unwrap();
    std::fs::write(path, safetensors::serialize([(name, view)], None).unwrap()).unwrap();
}

fn read_f32(bytes: &[u8], name: &str) -> Vec<f32> {
    let file = SafeTensors::deserialize(bytes).unwrap();
    file.tensor(name)
        .unwrap()
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

/// ‖a − b‖₂ / ‖b‖₂.
fn relative_error(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)))
        / norm(&mut b.iter().map(|&y| f64::from(y)))
}

#[test]
fn pytorch_loads_our_checkpoint_and_we_load_pytorchs_weights_with_the_same_logits() {
    let Some(python) = python_with("TORCH_PYTHON", "torch, safetensors", "REQUIRE_TORCH") else {
        return;
    };
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let layout = model.layout();
    let params = model.init_params(11);
    let n = layout.len();
    let state = TrainingState {
        hook: None,
        position: Position { epoch: 2, step: 0 },
        optimizer_step: 0,
        params: params.clone(),
        exp_avg: vec![0.0; n],
        exp_avg_sq: vec![0.0; n],
        epoch_loss_sum: vec![0.0],
        epoch_correct: vec![0.0],
        epoch_train_seconds: 0.0,
        epoch_visited: None,
        settings: Settings {
            seed: 11,
            ..Settings::default()
        },
    };
    let work = tempfile::tempdir().unwrap();
    let saved = CheckpointDir::new(work.path().join("ckpts"), 1)
        .save(&state, layout)
        .unwrap();
    std::fs::copy(
        saved.join(MODEL_FILE),
        work.path().join("model.safetensors"),
    )
    .unwrap();
    let x = batch();
    write_f32(
        &work.path().join("x.safetensors"),
        "x",
        vec![BATCH, 1, IMAGE_SIDE, IMAGE_SIDE],
        &x,
    );

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pytorch_load.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(work.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let torch_out = std::fs::read(work.path().join("out.safetensors")).unwrap();

    let ours = relative_error(
        &our_logits(&model, &params, &x),
        &read_f32(&torch_out, "ours_logits"),
    );
    assert!(
        ours <= 1e-5,
        "our weights: relative error {ours:e} between our logits and PyTorch's"
    );

    let weights = load_weights(&work.path().join("torch_init.safetensors"), layout).unwrap();
    let theirs = relative_error(
        &our_logits(&model, &weights, &x),
        &read_f32(&torch_out, "torch_logits"),
    );
    assert!(
        theirs <= 1e-5,
        "PyTorch's weights: relative error {theirs:e} between our logits and PyTorch's"
    );
    println!(
        "logits vs PyTorch, relative error: our weights {ours:e}, PyTorch's weights {theirs:e}"
    );
}
