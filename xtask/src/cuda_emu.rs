//! `cargo xtask cuda-emu`: builds the CUDA driver and NCCL emulator
//! (crates/cuda-emu) and prints the environment that makes a command use
//! it, for running the trainer or a bench on the CUDA backend without a GPU.

use std::path::PathBuf;

use anyhow::Context;
use cuda_emu::Emulator;

#[derive(clap::Args)]
pub struct Args {
    /// Where to build it.
    #[arg(long, default_value = "target/cuda-emu")]
    out: PathBuf,
    /// How many GPUs it shows (CUDA_EMU_DEVICES), e.g. one per rank for NCCL.
    #[arg(long, default_value_t = 1)]
    devices: u32,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let emulator = Emulator::build(&args.out)
        .with_context(|| format!("building the emulator in {}", args.out.display()))?;
    if cuda_emu::nvrtc_lib_dir().is_none() {
        eprintln!(
            "note: NVRTC's wheel was not found (pip install nvidia-cuda-nvrtc-cu12, or set \
             NVRTC_LIB_DIR); the CUDA backend needs it to compile its kernels"
        );
    }
    eprintln!(
        "built {}; run a command on it with (its times say nothing about a GPU):",
        emulator.dir().join("libcuda.so").display()
    );
    let mut dirs = vec![emulator.dir().display().to_string()];
    dirs.extend(cuda_emu::nvrtc_lib_dir().map(|d| d.display().to_string()));
    println!(
        "export LD_LIBRARY_PATH=\"{}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\" CUDA_EMU_DEVICES={}",
        dirs.join(":"),
        args.devices
    );
    Ok(())
}
