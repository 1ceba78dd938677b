//! How the matrix products inside conv2d and linear run on the GPU: their
//! arithmetic, their tiles and their staging, and the backend's choices of
//! them.

use super::Cuda;

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

/// How the GPU's float32 and TF32 products stage their operand tiles in
/// shared memory (`sgemm.cuh`'s `gemm_tile`). Both stage the same values in
/// the same layout, so the choice changes the speed and never a bit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GemmStaging {
    /// Each thread loads the next k tile into registers while the block
    /// multiplies this one, then stores it to shared memory: any GPU.
    #[default]
    Registers,
    /// `cp.async` copies global memory straight into two shared buffers,
    /// one k tile ahead, through no register (compute capability 8.0 and
    /// later; docs/gpu.md, "cp.async staging"). bf16 products keep the
    /// register staging: they convert as they stage.
    CpAsync,
}

impl GemmStaging {
    /// `registers` or `cp-async`, as a flag gives it.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "registers" => Ok(Self::Registers),
            "cp-async" => Ok(Self::CpAsync),
            other => Err(format!(
                "`{other}` is not a GEMM staging: registers or cp-async"
            )),
        }
    }
}

impl Cuda {
    /// This backend telling models to take the fused ops (the default) or
    /// not (`trainer --no-fusion`, to time the unfused kernels beside
    /// them); the ops compute the same bits either way.
    pub fn with_fusion(self, fusion: bool) -> Self {
        Self { fusion, ..self }
    }

    /// [`Self::with_fusion`]'s choice.
    pub(crate) fn fusion(&self) -> bool {
        self.fusion
    }

    /// This backend with the float32 and TF32 products in tiles of `tile`
    /// (bf16 products keep theirs).
    pub fn with_fp32_tile(self, tile: Fp32Tile) -> Self {
        Self {
            fp32_tile: tile,
            ..self
        }
    }

    /// How the float32 and TF32 products stage their tiles, as
    /// [`Cuda::with_products`] was told; bf16 products stage through
    /// registers whatever it says.
    pub fn gemm_staging(&self) -> GemmStaging {
        self.staging
    }

    /// The tile the products run in: [`Self::with_fp32_tile`]'s for float32
    /// and TF32, always [`Fp32Tile::Square`] for bf16.
    pub(crate) fn gemm_tile(&self) -> Fp32Tile {
        match self.matmul {
            MatmulPrecision::Fp32 | MatmulPrecision::Tf32 => self.fp32_tile,
            MatmulPrecision::Bf16 => Fp32Tile::Square,
        }
    }

    /// How this backend's conv2d and linear products multiply.
    pub fn matmul_precision(&self) -> MatmulPrecision {
        self.matmul
    }
}
