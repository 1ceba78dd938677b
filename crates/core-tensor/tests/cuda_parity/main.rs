//! Every op, forward and backward, on each device against the one-thread CPU
//! reference, on fresh random inputs.
//!
//! Each body is generic over `B: Ops` and runs on a two-thread CPU backend
//! (present everywhere) and on CUDA device 0 when there is one. Without a
//! GPU the CUDA runs print that they were skipped; REQUIRE_GPU=1 makes that
//! a failure (the device bundle's run.sh sets it).
//!
//! Tolerances, per op:
//! * exact bits: ReLU, max-pool, dropout, gather, accuracy, Adam, and the
//!   linear bias gradient. Each output is a fixed sequence of correctly
//!   rounded f32 operations on both devices (the Adam kernel spells out
//!   every rounding so the GPU cannot fuse a multiply-add).
//! * GEMM-based ops (conv2d, linear): the sum-of-products bound of
//!   `support::assert_within_sum_bound`; the devices add in different
//!   orders, so a fixed relative tolerance would be either loose or flaky.
//!   TF32 and bf16 products widen it by their inputs' rounding (bf16.rs
//!   also holds bf16 to float32's bound on inputs rounded to bf16).
//! * cross-entropy: 1e-5 relative to each term's scale. exp/ln differ by a
//!   few ulp between libm and CUDA (≤ 2 ulp for expf), and the batch sum is
//!   a tree on the GPU.
//! * NaN, in every comparison: where the reference has a NaN the device
//!   must have one, of any payload and sign (`support::nan_rule` says why:
//!   a GPU's arithmetic makes 0x7fffffff, an x86 core keeps the operand's).

mod bf16;
mod fused;
mod kernel_cache;
mod layers;
mod nan_bits;
mod pointwise;
mod staging;
mod support;
mod training_step;

use core_tensor::ops::{ClassGeom, Dropout, RowsGeom};
use core_tensor::{Backend, Cuda, Error, Ops, cuda_available};
use support::{uniform, up};

/// Input the CPU rejects is an error on every device: at once on the CPU, at
/// the next synchronization on a GPU; and the backend stays usable.
fn invalid_input_is_an_error<B: Ops>(dev: &B) {
    let g = ClassGeom {
        batch: 4,
        classes: 10,
    };
    let logits = up(dev, &uniform(900, 40, -1.0, 1.0));
    let mut dz = dev.zeros(40).unwrap();
    let mut loss = dev.zeros(1).unwrap();
    let bad = up(dev, &[1u8, 10, 2, 3]);
    let err = dev
        .cross_entropy_fwd_bwd(&g, &logits, &bad, &mut dz, &mut loss)
        .and_then(|()| dev.synchronize())
        .unwrap_err();
    assert!(err.to_string().contains("label"), "{err}");
    let good = up(dev, &[1u8, 9, 2, 3]);
    dev.cross_entropy_fwd_bwd(&g, &logits, &good, &mut dz, &mut loss)
        .unwrap();
    dev.synchronize().unwrap();

    let share = |host: Vec<u8>| dev.share(&std::sync::Arc::new(host)).unwrap();
    let (images, labels) = (share(vec![7u8; 6]), share(vec![1u8; 3]));
    let indices = up(dev, &[0u32, 3]);
    let (mut x, mut y) = (dev.zeros(4).unwrap(), dev.zeros(2).unwrap());
    let err = dev
        .gather_batch(
            &images,
            &labels,
            2,
            &indices,
            0..2,
            Some(&mut x),
            Some(&mut y),
        )
        .and_then(|()| dev.synchronize())
        .unwrap_err();
    assert!(err.to_string().contains("sample index"), "{err}");
    dev.synchronize().unwrap();
    // Row ids must increase; the scatter writes nothing for a bad one.
    let g = RowsGeom {
        count: 2,
        dim: 2,
        rows: 3,
        offset: 0,
    };
    let mut flat = up(dev, &[0.0f32; 6]);
    let err = dev
        .rows_scatter(&g, &up(dev, &[1u32, 1]), &up(dev, &[5.0f32; 4]), &mut flat)
        .and_then(|()| dev.synchronize())
        .unwrap_err();
    assert!(err.to_string().contains("rows"), "{err}");
    dev.synchronize().unwrap();
}

#[test]
fn invalid_input() {
    invalid_input_is_an_error(&support::cpu2());
    if let Some(gpu) = support::own_gpu("invalid_input") {
        invalid_input_is_an_error(&gpu);
        // The driver cannot allocate zero bytes: a typed error, not its code.
        let err = gpu.zeros::<f32>(0).unwrap_err();
        assert!(err.to_string().contains("at least one element"), "{err}");
    }
}

/// Marks time the device's work in order, and a mark recorded again moves
/// on: on the CPU the host clock, on a GPU timing events (events made with
/// cudarc's default flags cannot be timed, and this fails).
fn marks_time_the_work<B: Ops>(dev: &B) {
    let y = up(dev, &uniform(7, 1 << 20, -1.0, 1.0));
    let mut dy = up(dev, &uniform(8, 1 << 20, -1.0, 1.0));
    let mut start = dev.mark().unwrap();
    for _ in 0..20 {
        dev.relu_bwd(Dropout::OFF, &y, &mut dy).unwrap();
    }
    let middle = dev.mark().unwrap();
    dev.relu_bwd(Dropout::OFF, &y, &mut dy).unwrap();
    let end = dev.mark().unwrap();
    let (first, second) = (
        dev.seconds_between(&start, &middle).unwrap(),
        dev.seconds_between(&middle, &end).unwrap(),
    );
    let whole = dev.seconds_between(&start, &end).unwrap();
    assert!(first > 0.0 && second >= 0.0, "{first} {second}");
    assert!(
        whole >= first && whole >= second,
        "{whole} {first} {second}"
    );
    dev.record_mark(&mut start).unwrap();
    assert!(dev.seconds_between(&end, &start).unwrap() >= 0.0);
}

#[test]
fn marks() {
    marks_time_the_work(&support::cpu2());
    if let Some(gpu) = support::own_gpu("marks") {
        marks_time_the_work(&gpu);
    }
}

/// `cuda_available` answers on every machine; never a panic.
#[test]
fn cuda_availability_is_an_answer() {
    match cuda_available() {
        Ok(0) => assert!(matches!(Cuda::new(0), Err(Error::NoCudaDevice { .. }))),
        Ok(count) => {
            let err = Cuda::new(count).unwrap_err();
            assert!(matches!(err, Error::NoCudaDevice { ordinal, .. } if ordinal == count));
            println!("{count} CUDA device(s)");
        }
        Err(e) => {
            assert!(e.to_string().contains("libcuda"), "{e}");
            assert!(Cuda::new(0).is_err());
            println!("no CUDA driver: {}", e.with_causes());
        }
    }
    if std::env::var("REQUIRE_GPU").is_ok_and(|v| v == "1") {
        assert!(
            cuda_available().is_ok_and(|n| n > 0),
            "REQUIRE_GPU=1, but no GPU"
        );
    }
}

/// The whole suite again on `cuda-emu` (crates/cuda-emu), the CPU stand-in
/// for the CUDA driver, with REQUIRE_GPU=1: every launch, argument list and
/// kernel of the CUDA backend runs and is compared with the CPU, on a
/// machine without a GPU.
/// Its kernels come from the cache the build tree's emulated runs share
/// (filled by the first to need a module); the tests run in one re-run per
/// core, as the emulator runs one kernel at a time in a process.
#[test]
fn suite_on_the_cuda_emulator() {
    cuda_emu::rerun_side_by_side_on_emulator(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &["--skip", "suite_on_the_cuda_emulator"],
        &[("REQUIRE_GPU", "1")],
        15,
    );
}
