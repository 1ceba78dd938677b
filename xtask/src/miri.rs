//! `cargo xtask miri`: the CPU's `unsafe` code (core-tensor's `simd`
//! microkernels, dropout's mask loops and its `gemm` front) under Miri, which interprets every
//! instruction and fails on undefined behaviour: a read or write outside an
//! allocation, pointer arithmetic past one, an uninitialised value.
//!
//! It runs the tests once per instruction set with that set enabled, so the
//! AVX-512 kernels run (interpreted) on any x86-64 CPU, also one without
//! AVX-512, where nothing else can run them. Miri needs the nightly
//! toolchain with its `miri` and `rust-src` components.

use std::process::Command;

use anyhow::{Context, bail};

/// The tests run under Miri: every kernel against its definition (`simd::`
/// holds the convolution microkernels, `dropout::mask::` the mask loops), small
/// enough to interpret in seconds (the convolution tests take Miri minutes).
/// `gemm::` also matches the CUDA GEMM planner's host-side tests, which
/// take no time.
const FILTERS: [&str; 3] = ["simd::", "dropout::mask::", "gemm::"];

/// How the error begins when Miri is missing (xtask's miri test skips on it).
const NOT_INSTALLED: &str = "Miri is not installed for the nightly toolchain";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Isa {
    /// AVX2 and FMA: the 8-lane kernels, and the 16-lane shapes in pairs.
    Avx2,
    /// AVX-512F: the 16-lane kernels.
    Avx512,
}

impl Isa {
    /// The x86-64 level of the CPUs that have it, which Miri's feature
    /// detection then reports: the `gemm` crate wants the level's whole
    /// feature set (AVX-512F alone leaves it without a kernel).
    fn target_cpu(self) -> &'static str {
        match self {
            Isa::Avx2 => "x86-64-v3",
            Isa::Avx512 => "x86-64-v4",
        }
    }
}

#[derive(clap::Args)]
pub struct Args {
    /// Run only this instruction set's kernels (default: both).
    #[arg(long, value_enum)]
    isa: Option<Isa>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let installed = Command::new("cargo")
        .args(["+nightly", "miri", "--version"])
        // Only asks: rustup would otherwise download a missing nightly.
        .env("RUSTUP_AUTO_INSTALL", "0")
        .output()
        .is_ok_and(|out| out.status.success());
    if !installed {
        bail!(
            "{NOT_INSTALLED}: install it with `rustup toolchain install nightly --component miri,rust-src`"
        );
    }
    let isas = args
        .isa
        .map_or(vec![Isa::Avx2, Isa::Avx512], |isa| vec![isa]);
    for isa in isas {
        eprintln!("== Miri, core-tensor's {FILTERS:?} tests, {isa:?}");
        let status = Command::new("cargo")
            .args([
                "+nightly",
                "miri",
                "test",
                "-p",
                "core-tensor",
                "--lib",
                "--",
            ])
            .args(FILTERS)
            .env("RUSTFLAGS", format!("-Ctarget-cpu={}", isa.target_cpu()))
            // A build folder per level: the other's flags would rebuild
            // every dependency on each run.
            .env(
                "CARGO_TARGET_DIR",
                format!("target/miri-{}", isa.target_cpu()),
            )
            .status()
            .context("running cargo +nightly miri")?;
        if !status.success() {
            bail!("Miri failed the {isa:?} kernels ({status}); its report is above");
        }
    }
    Ok(())
}
