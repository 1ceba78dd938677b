//! `--tf32` or `--bf16` on a GPU that cannot do them: refused at start-up,
//! naming the flag, the GPU's compute capability and the way out, rather
//! than training in float32 unasked or failing inside a kernel. Runs on
//! cuda-emu posing as a compute capability 7.5 GPU. (The tensor-core kernels
//! themselves are checked by core-tensor's parity suite, bf16 training by
//! cuda_emulated.rs; trainings on a GPU run in the device bundle.)

mod common;

use common::{data_arg, dataset, run, stderr, trainer};

const EMULATED: [&str; 1] = ["emulated_tensor_cores_before_ampere_are_refused_with_the_way_out"];

#[test]
fn tensor_cores_on_the_cuda_emulator() {
    let mut args = vec!["--exact", "--test-threads=1"];
    args.extend(EMULATED);
    cuda_emu::rerun_on_emulator(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &args,
        &[("CUDA_EMU_COMPUTE_CAP", "7.5")],
        EMULATED.len(),
    );
}

#[test]
fn emulated_tensor_cores_before_ampere_are_refused_with_the_way_out() {
    if !cuda_emu::in_emulator() {
        return;
    }
    for flag in ["--tf32", "--bf16"] {
        let out = run(trainer()
            .args([
                "--device",
                "cuda",
                flag,
                "--epochs",
                "1",
                "--max-steps",
                "1",
            ])
            .args(data_arg(dataset())));
        let err = stderr(&out);
        assert!(!out.status.success(), "{err}");
        for needle in [
            flag,
            "compute capability 8.0",
            "has 7.5",
            "float32 (the default)",
        ] {
            assert!(err.contains(needle), "no {needle:?} in: {err}");
        }
        assert!(!err.contains("panicked"), "{err}");
    }
}
