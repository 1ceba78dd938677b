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
    /// `f32`, `tf32` or `bf16`, as `--precision` gives it.
    pub fn parse(name: &str) -> Result<Self, String> {
        match name {
            "f32" => Ok(Self::Fp32),
            "tf32" => Ok(Self::Tf32),
            "bf16" => Ok(Self::Bf16),
            other => Err(format!(
                "`{other}` is not a precision of the products: f32, tf32 or bf16"
            )),
        }
    }

    /// The name [`Self::parse`] takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Fp32 => "f32",
            Self::Tf32 => "tf32",
            Self::Bf16 => "bf16",
        }
    }

    /// What the `--tf32` and `--bf16` flags ask for: at most one of them.
    pub fn from_flags(tf32: bool, bf16: bool) -> Result<Self, String> {
        match (tf32, bf16) {
            (true, true) => {
                Err("--tf32 and --bf16 are two precisions of the same products: give one".into())
            }
            (false, true) => Ok(Self::Bf16),
            (true, false) => Ok(Self::Tf32),
            (false, false) => Ok(Self::Fp32),
        }
    }
}

impl std::str::FromStr for MatmulPrecision {
    type Err = String;

    fn from_str(name: &str) -> Result<Self, String> {
        Self::parse(name)
    }
}

impl std::fmt::Display for MatmulPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

/// The products a backend runs: a precision with the tile and staging it
/// allows. bf16 converts its operands as it stages them, so it has the
/// square tiles and the register staging only: a wide or cp.async bf16
/// product cannot be written down ([`Products::new`] refuses it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Products {
    /// Float32 on the CUDA cores.
    F32 {
        tile: Fp32Tile,
        staging: GemmStaging,
    },
    /// TF32 on the tensor cores.
    Tf32 {
        tile: Fp32Tile,
        staging: GemmStaging,
    },
    /// bf16 on the tensor cores, square tiles staged through registers.
    Bf16,
}

/// A tile or staging that the products asked for (bf16) or the device (the
/// CPU) does not have: no kernel runs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RefusedProducts {
    #[error(
        "--fp32-tile wide is the tile of a GPU's float32 and TF32 products; --precision bf16 (--bf16) and --device cpu have none (leave it out)"
    )]
    WideTile,
    #[error(
        "--gemm-staging cp-async stages a GPU's float32 and TF32 products; --precision bf16 (--bf16, which converts as it stages) and --device cpu have none (leave it out)"
    )]
    CpAsyncStaging,
}

impl Default for Products {
    fn default() -> Self {
        Self::from(MatmulPrecision::Fp32)
    }
}

impl From<MatmulPrecision> for Products {
    /// The products in `precision`, in square tiles staged through
    /// registers.
    fn from(precision: MatmulPrecision) -> Self {
        let (tile, staging) = (Fp32Tile::Square, GemmStaging::Registers);
        match precision {
            MatmulPrecision::Fp32 => Self::F32 { tile, staging },
            MatmulPrecision::Tf32 => Self::Tf32 { tile, staging },
            MatmulPrecision::Bf16 => Self::Bf16,
        }
    }
}

impl Products {
    /// The products in `precision`, tiles of `tile` staged by `staging`;
    /// bf16 takes the square tiles and the register staging only.
    pub fn new(
        precision: MatmulPrecision,
        tile: Fp32Tile,
        staging: GemmStaging,
    ) -> Result<Self, RefusedProducts> {
        match (precision, tile, staging) {
            (MatmulPrecision::Fp32, ..) => Ok(Self::F32 { tile, staging }),
            (MatmulPrecision::Tf32, ..) => Ok(Self::Tf32 { tile, staging }),
            (MatmulPrecision::Bf16, Fp32Tile::Wide, _) => Err(RefusedProducts::WideTile),
            (MatmulPrecision::Bf16, _, GemmStaging::CpAsync) => {
                Err(RefusedProducts::CpAsyncStaging)
            }
            (MatmulPrecision::Bf16, Fp32Tile::Square, GemmStaging::Registers) => Ok(Self::Bf16),
        }
    }

    /// These products in tiles of `tile`.
    pub fn with_tile(self, tile: Fp32Tile) -> Result<Self, RefusedProducts> {
        Self::new(self.precision(), tile, self.staging())
    }

    /// How they multiply.
    pub fn precision(self) -> MatmulPrecision {
        match self {
            Self::F32 { .. } => MatmulPrecision::Fp32,
            Self::Tf32 { .. } => MatmulPrecision::Tf32,
            Self::Bf16 => MatmulPrecision::Bf16,
        }
    }

    /// Their tiles ([`Fp32Tile::Square`] for bf16).
    pub fn tile(self) -> Fp32Tile {
        match self {
            Self::F32 { tile, .. } | Self::Tf32 { tile, .. } => tile,
            Self::Bf16 => Fp32Tile::Square,
        }
    }

    /// How they stage their tiles ([`GemmStaging::Registers`] for bf16).
    pub fn staging(self) -> GemmStaging {
        match self {
            Self::F32 { staging, .. } | Self::Tf32 { staging, .. } => staging,
            Self::Bf16 => GemmStaging::Registers,
        }
    }

    /// What of these products needs compute capability 8.0 and how to do
    /// without it, if anything does.
    pub(crate) fn needs_ampere(self) -> Option<(&'static str, &'static str)> {
        let keep = "leave the products in float32 (the default)";
        match self {
            Self::F32 {
                staging: GemmStaging::Registers,
                ..
            } => None,
            Self::F32 {
                staging: GemmStaging::CpAsync,
                ..
            } => Some((
                "cp.async staging of the products' tiles",
                "stage them through registers (the default)",
            )),
            Self::Tf32 { .. } => Some(("TF32 on the tensor cores", keep)),
            Self::Bf16 => Some(("bf16 mixed precision on the tensor cores", keep)),
        }
    }

    /// How a backend's description names them: nothing for the default.
    pub(crate) fn describe(self) -> String {
        let precision = match (self.precision(), self.tile()) {
            (MatmulPrecision::Fp32, Fp32Tile::Square) => "",
            (MatmulPrecision::Fp32, Fp32Tile::Wide) => ", wide float32 tiles",
            (MatmulPrecision::Tf32, Fp32Tile::Square) => ", TF32 matmuls",
            (MatmulPrecision::Tf32, Fp32Tile::Wide) => ", TF32 matmuls in wide tiles",
            (MatmulPrecision::Bf16, _) => ", bf16 matmuls",
        };
        let staging = match self.staging() {
            GemmStaging::CpAsync => ", cp.async staging",
            GemmStaging::Registers => "",
        };
        format!("{precision}{staging}")
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

    /// This backend with its products in tiles of `tile` (the tile needs no
    /// more of the GPU than the square one; bf16 refuses the wide one).
    pub fn with_fp32_tile(self, tile: Fp32Tile) -> Result<Self, RefusedProducts> {
        Ok(Self {
            products: self.products.with_tile(tile)?,
            ..self
        })
    }

    /// The products this backend's conv2d and linear run.
    pub fn products(&self) -> Products {
        self.products
    }

    /// How the float32 and TF32 products stage their tiles, as
    /// [`Cuda::with_products`] was told; bf16 products stage through
    /// registers.
    pub fn gemm_staging(&self) -> GemmStaging {
        self.products.staging()
    }

    /// The tile the products run in: [`Self::with_fp32_tile`]'s for float32
    /// and TF32, always [`Fp32Tile::Square`] for bf16.
    pub(crate) fn gemm_tile(&self) -> Fp32Tile {
        self.products.tile()
    }

    /// How this backend's conv2d and linear products multiply.
    pub fn matmul_precision(&self) -> MatmulPrecision {
        self.products.precision()
    }
}
