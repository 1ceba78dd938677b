//! How the matrix products inside conv2d and linear run on the GPU: their
//! arithmetic and their tiles.

/// How the matrix products inside conv2d and linear multiply on the GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// Float32 fused multiply-adds on the CUDA cores: the CPU backend's
    /// arithmetic up to summation order (parity within 1e-5).
    #[default]
    Fp32,
    /// TF32 on the tensor cores (compute capability 8.0 and later): inputs
    /// rounded to a 10-bit mantissa, products accumulated in float32. Faster,
    /// and about 1e-3 from float32 (PyTorch's `allow_tf32`).
    Tf32,
    /// Mixed precision on the tensor cores (compute capability 8.0 and
    /// later), as PyTorch's bf16 autocast: inputs rounded to bf16 (8
    /// significant bits, to nearest even), products accumulated in float32;
    /// weights, gradients and the optimizer stay float32. About 1e-2 from
    /// float32, where TF32 is 1e-3; half the shared memory and MMA
    /// instructions per product (docs/gpu.md, "Mixed precision").
    Bf16,
}

impl MatmulPrecision {
    /// TF32 when `tf32` (a `--tf32` flag), float32 otherwise.
    pub fn from_tf32(tf32: bool) -> Self {
        if tf32 { Self::Tf32 } else { Self::Fp32 }
    }

    /// What the `--tf32` and `--bf16` flags ask for: at most one of them.
    pub fn from_flags(tf32: bool, bf16: bool) -> Result<Self, String> {
        match (tf32, bf16) {
            (true, true) => {
                Err("--tf32 and --bf16 are two precisions of the same products: give one".into())
            }
            (false, true) => Ok(Self::Bf16),
            (tf32, false) => Ok(Self::from_tf32(tf32)),
        }
    }
}

/// The tiles of the GPU's matrix products (`sgemm.cuh`), in either
/// precision. Both sum every output in the same order, so the choice changes
/// the speed and never a bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fp32Tile {
    /// 64 × 64 outputs per block of 256 threads (32 × 128 for products of
    /// at most 32 rows): 4 × 4 per thread on the CUDA cores, 32 × 16 per
    /// warp on the tensor cores.
    #[default]
    Square,
    /// 64 × 256 outputs per block, 8 × 8 per thread or 64 × 32 per warp, for
    /// products of more than 32 rows and at least 1024 columns (others keep
    /// the square tiles). Each shared-memory load feeds twice the
    /// multiply-adds, each staged element four times the products, at four
    /// times the accumulator registers.
    Wide,
}

impl Fp32Tile {
    /// `square` or `wide`, as a flag gives it.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "square" => Ok(Self::Square),
            "wide" => Ok(Self::Wide),
            other => Err(format!("`{other}` is not a GEMM tile: square or wide")),
        }
    }
}
