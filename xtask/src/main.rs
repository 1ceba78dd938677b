//! Repository automation, run as `cargo xtask <task>` (see `.cargo/config.toml`).
//!
//! One file per task; this file only dispatches.

mod cuda_emu;
mod device_bundle;
mod fetch_data;
mod gpu_report;
mod image;
mod interrupt;
mod miri;
mod slurm_submit;
mod test_suite;
mod trainer_build;

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Repository tasks for the data-parallel trainer")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Download the four FashionMNIST files into data/fashion-mnist/, verifying checksums
    /// (`fetch-data movielens`: MovieLens ratings into data/movielens/).
    FetchData(fetch_data::Args),
    /// Render a SLURM batch script for the trainer and submit it with sbatch.
    SlurmSubmit(Box<slurm_submit::Args>),
    /// Build a container image of the trainer from Debian packages (mmdebstrap): a directory and a tarball.
    Image(image::Args),
    /// Build the trainer and the GPU tests into device-bundle/, with a run.sh for a GPU machine.
    DeviceBundle(device_bundle::Args),
    /// Build the CUDA driver and NCCL emulator (CPU only) and print how to run a command on it.
    CudaEmu(cuda_emu::Args),
    /// Print docs/gpu.md's tables (throughput, goals, kernels) from a device-bundle run's logs.
    GpuReport(gpu_report::Args),
    /// Run the CPU kernels' unsafe code under Miri, with AVX2 and with AVX-512 enabled.
    Miri(miri::Args),
    /// Run the workspace's tests (`cargo test --workspace`), test binaries side by side.
    Test(test_suite::Args),
}

fn main() -> ExitCode {
    let result = match Cli::parse().task {
        Task::FetchData(args) => fetch_data::run(args),
        Task::SlurmSubmit(args) => slurm_submit::run(*args),
        Task::Image(args) => image::run(args),
        Task::DeviceBundle(args) => device_bundle::run(args),
        Task::CudaEmu(args) => cuda_emu::run(args),
        Task::GpuReport(args) => gpu_report::run(args),
        Task::Miri(args) => miri::run(args),
        Task::Test(args) => test_suite::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line with the whole chain, as the trainer prints it. Returning
            // the error from main would print anyhow's Debug form instead, with
            // a stack backtrace whenever RUST_BACKTRACE is set in the user's
            // shell: noise for what is nearly always a mistyped flag. Not
            // eprintln!, which panics when stderr is gone.
            let _ = writeln!(std::io::stderr(), "error: {e:#}");
            // A fetch stopped by a signal: the status a second one gives.
            if e.chain().any(|cause| cause.is::<fetch_data::Interrupted>()) {
                ExitCode::from(fetch_data::INTERRUPTED_EXIT_STATUS)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
