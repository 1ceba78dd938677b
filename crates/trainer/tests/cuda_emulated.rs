//! The training loop on the CUDA backend, run without a GPU on `cuda-emu`
//! (crates/cuda-emu), the CPU stand-in for the CUDA driver: batches
//! gathered on the device, dropout, the fused loss, the finiteness guard,
//! Adam, evaluation, and gradients staged through page-locked buffers for
//! the TCP ring.
//!
//! `training_on_the_cuda_emulator` builds the emulator and re-runs this
//! binary with it loaded; there the `emulated_*` tests do the work (in the
//! first run they return at once). Skipped where a GPU is present (the
//! device bundle trains on it) and where the emulator cannot be built or
//! NVRTC is missing; REQUIRE_CUDA_EMU=1 turns those skips into failures.

mod common;

use std::path::Path;
use std::time::Duration;

use comm::{CommConfig, TcpCommunicator};
use common::free_port;
use core_tensor::ops::AdamConfig;
use core_tensor::{Backend, Cpu, Cuda, Ops, cuda_available};
use fashion_mnist::{FashionMnist, Layout, synth};
use trainer::ddp::CommThread;
use trainer::model::DropoutRates;
use trainer::train::{Silent, TrainConfig, Trainer};

/// Set in the re-run, where the emulator is loaded.
const ON_EMULATOR: &str = "TRAINER_ON_CUDA_EMU";
const EMULATED: [&str; 2] = [
    "emulated_gpu_training_follows_the_cpu",
    "emulated_gpu_ranks_sharing_one_gpu_stay_identical",
];
const STEPS: usize = 4;

#[test]
fn training_on_the_cuda_emulator() {
    if std::env::var_os(ON_EMULATOR).is_some() {
        return;
    }
    if cuda_available().is_ok_and(|n| n > 0) {
        println!("skipped: a GPU is present (the device bundle trains on it)");
        return;
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda-emu");
    let emulator = match cuda_emu::Emulator::build(&dir) {
        Ok(emulator) => emulator,
        Err(e) => return skip(&e.to_string()),
    };
    if cuda_emu::nvrtc_lib_dir().is_none() {
        return skip("NVRTC not found (pip install nvidia-cuda-nvrtc-cu12, or set NVRTC_LIB_DIR)");
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary path"))
        .args(["--exact", "--test-threads=1"])
        .args(EMULATED)
        .env("LD_LIBRARY_PATH", emulator.library_path())
        .env(ON_EMULATOR, "1")
        .output()
        .expect("re-run the tests");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "training failed on the emulator");
    assert!(
        stdout.contains(&format!("test result: ok. {} passed", EMULATED.len())),
        "not every emulated test ran"
    );
}

fn skip(why: &str) {
    assert!(
        std::env::var("REQUIRE_CUDA_EMU").map_or(true, |v| v != "1"),
        "REQUIRE_CUDA_EMU=1, but: {why}"
    );
    println!("skipped: {why}");
}

/// The emulated GPU, in the re-run only.
fn emulated_gpu() -> Option<Cuda> {
    std::env::var_os(ON_EMULATOR)?;
    let gpu = Cuda::new(0).expect("the emulator is loaded");
    assert!(gpu.describe().contains("cuda-emu"), "{}", gpu.describe());
    Some(gpu)
}

fn data() -> FashionMnist {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout {
        train_len: 2 * 16 * STEPS,
        test_len: 50,
    };
    synth::write_dataset(dir.path(), layout).unwrap();
    FashionMnist::load_with(dir.path(), layout).unwrap()
}

fn config(batch_size: usize, dropout: DropoutRates) -> TrainConfig {
    TrainConfig {
        epochs: 1,
        batch_size,
        adam: AdamConfig::default(),
        seed: 5,
        max_steps: Some(STEPS),
        dropout,
        // Small buckets: several all-reduces per step.
        bucket_mb: 0.5,
    }
}

/// One epoch of `STEPS` steps: the parameters after each, and the test
/// accuracy at the end.
fn train<B: Ops>(
    backend: B,
    data: &FashionMnist,
    cfg: TrainConfig,
    comm: Option<CommThread>,
) -> (Vec<Vec<f32>>, f64) {
    let mut trainer = Trainer::new(backend, data, cfg, comm).unwrap();
    let mut history = Vec::new();
    trainer
        .train_epoch(1, &mut Silent, &mut |t| {
            history.push(t.params()?);
            Ok(())
        })
        .unwrap();
    let accuracy = trainer.evaluate().unwrap();
    assert_eq!(history.len(), STEPS);
    (history, accuracy)
}

/// ‖a − b‖₂ / ‖b‖₂.
fn relative_difference(a: &[f32], b: &[f32]) -> f64 {
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    norm(&mut a.iter().zip(b).map(|(x, y)| f64::from(x - y)))
        / norm(&mut b.iter().map(|&y| f64::from(y)))
}

/// With dropout on: the same masks on both devices (one counter-based RNG),
/// so the GPU follows the CPU up to the order of its sums.
#[test]
fn emulated_gpu_training_follows_the_cpu() {
    let Some(gpu) = emulated_gpu() else { return };
    let data = data();
    let cfg = config(16, DropoutRates::REFERENCE);
    let (on_gpu, gpu_accuracy) = train(gpu, &data, cfg.clone(), None);
    let (on_cpu, cpu_accuracy) = train(Cpu::new(1).unwrap(), &data, cfg, None);
    for (step, (g, c)) in on_gpu.iter().zip(&on_cpu).enumerate() {
        let relative = relative_difference(g, c);
        assert!(
            relative <= 1e-5,
            "step {}: GPU and CPU parameters differ by {relative:e}",
            step + 1
        );
    }
    assert_ne!(
        on_gpu[0],
        on_gpu[STEPS - 1],
        "training must move the parameters"
    );
    assert_eq!(gpu_accuracy, cpu_accuracy, "test accuracy");
}

/// Two ranks on one GPU over the TCP ring (NCCL refuses that), gradients
/// staged through page-locked host buffers: the ranks stay bitwise
/// identical, and with dropout off they follow one CPU rank of twice the
/// batch.
#[test]
fn emulated_gpu_ranks_sharing_one_gpu_stay_identical() {
    let Some(gpu) = emulated_gpu() else { return };
    let data = data();
    let port = free_port();
    let ranks: Vec<Vec<Vec<f32>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                let (data, gpu) = (&data, gpu.clone());
                s.spawn(move || {
                    let cfg = CommConfig::new(rank, 2, "127.0.0.1", port)
                        .with_timeout(Duration::from_secs(60));
                    let comm = TcpCommunicator::connect(&cfg).unwrap();
                    let comm = CommThread::spawn(Box::new(comm)).unwrap();
                    train(gpu, data, config(16, DropoutRates::OFF), Some(comm)).0
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (step, (a, b)) in ranks[0].iter().zip(&ranks[1]).enumerate() {
        assert!(
            a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
            "ranks differ after step {}",
            step + 1
        );
    }
    let (single, _) = train(
        Cpu::new(1).unwrap(),
        &data,
        config(32, DropoutRates::OFF),
        None,
    );
    let relative = relative_difference(&ranks[0][STEPS - 1], &single[STEPS - 1]);
    assert!(
        relative <= 1e-5,
        "2 GPU ranks of 16 and 1 CPU rank of 32 differ by {relative:e}"
    );
}
