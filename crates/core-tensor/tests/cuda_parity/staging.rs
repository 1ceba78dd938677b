//! The cp.async staging of the GEMM tiles (`GemmStaging::CpAsync`) copies
//! the same values into the same shared layout as the register staging, and
//! TF32 rounds at the fragment loads in both, so every conv and linear
//! shape gives the register staging's bits: float32 and TF32, square and
//! wide tiles, with and without a split K (conv2's weight gradient and
//! fc1's splits). The fused ops under cp.async are fused.rs's.

use core_tensor::{Backend, Fp32Tile, GemmStaging, MatmulPrecision};

use crate::layers::gives_the_same_bits;
use crate::support::gpu_staged;

fn staging_gives_the_register_bits(test: &str, precision: MatmulPrecision) {
    let registers = gpu_staged(test, precision, GemmStaging::Registers);
    let copied = gpu_staged(test, precision, GemmStaging::CpAsync);
    if let (Some(registers), Some(copied)) = (registers, copied) {
        for tile in [Fp32Tile::Square, Fp32Tile::Wide] {
            let copied = copied.clone().with_fp32_tile(tile).unwrap();
            assert!(
                copied.describe().contains("cp.async"),
                "{}",
                copied.describe()
            );
            gives_the_same_bits(&registers.clone().with_fp32_tile(tile).unwrap(), &copied);
        }
    }
}

#[test]
fn cp_async_fp32_staging_gives_the_register_bits() {
    let test = "cp_async_fp32_staging_gives_the_register_bits";
    staging_gives_the_register_bits(test, MatmulPrecision::Fp32);
}

#[test]
fn cp_async_tf32_staging_gives_the_register_bits() {
    let test = "cp_async_tf32_staging_gives_the_register_bits";
    staging_gives_the_register_bits(test, MatmulPrecision::Tf32);
}
