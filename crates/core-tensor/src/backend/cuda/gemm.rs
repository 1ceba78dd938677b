//! The host side of the shared SGEMM tile (`sgemm.cuh`): its launch struct
//! and the split-K plan.
//!
//! The plan is a function of the GEMM's shape alone, never of the device, so
//! the order of every sum — and hence every result bit — is the same run to
//! run and on every GPU.

use cudarc::driver::LaunchConfig;

use super::launch::{GemmLaunch, GemmTiling, In, Out, Val};
use super::variants::GemmVariant;

use crate::{Cuda, Error, Fp32Tile, Products, Result};

/// The tiles; mirror `GEMM_BK`, `GEMM_THREADS` and `GEMM_TILE_ELEMS` in
/// sgemm.cuh. A tile has `tile_m` rows (64, or 32 for short products) and
/// `TILE_ELEMS / tile_m` columns, or with [`Fp32Tile::Wide`] 64 x
/// [`WIDE_TILE_N`].
const BK: usize = 16;
const THREADS: u32 = 256;
const TILE_ELEMS: usize = 4096;
/// The columns of [`Fp32Tile::Wide`]'s 64-row tile.
const WIDE_TILE_N: usize = 256;
/// [`Fp32Tile::Wide`] takes a product only from this many wide tiles
/// across, so that the last tile's padding columns are under a quarter of
/// its columns (conv2's weight gradient, 288 columns, keeps 64 x 64: in
/// 64 x 256 tiles 44% of its products would be padding).
const WIDE_MIN_TILES_N: usize = 4;

/// Rows of the tile for an `m × n` output: 32 when m fits in 32 rows and the
/// output is wide enough to fill a 128-column tile, so that half of every
/// tile's FMAs are not spent on padding rows; 64 otherwise.
fn tile_rows(m: usize, n: usize) -> usize {
    if m <= 32 && n > 64 { 32 } else { 64 }
}
/// K is split until about this many blocks run: two waves on a 132-SM H100.
/// Small outputs with a long K (a conv weight gradient sums over every pixel
/// of the batch) would otherwise run on a handful of SMs.
const TARGET_BLOCKS: usize = 264;
/// The most elements a split-K workspace holds: K is split only while the
/// square tiles are fewer than [`TARGET_BLOCKS`], into at most
/// `ceil(TARGET_BLOCKS / tiles)` splits of the output's size, which the
/// tiles cover: splits·m·n ≤ (TARGET_BLOCKS + tiles − 1)·TILE_ELEMS.
pub(crate) const MAX_WORKSPACE_LEN: usize = 2 * TARGET_BLOCKS * TILE_ELEMS;
/// The least k one split covers (16 tiles of BK), so that writing and
/// re-reading the partial tiles stays cheap next to the arithmetic.
const MIN_K_CHUNK: usize = 256;
/// From this many splits a warp sums each element; mirrors
/// `GEMM_WIDE_REDUCE_SPLITS` in sgemm.cuh.
const WIDE_REDUCE_SPLITS: usize = 32;
/// The grid's y (M tiles) and z (splits) limit.
const MAX_GRID_YZ: usize = 65_535;

/// How one `M × N × K` product is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmPlan {
    m: usize,
    n: usize,
    /// Rows of one tile (32 or 64).
    tile_m: usize,
    /// Columns of one tile: `TILE_ELEMS / tile_m`, or [`WIDE_TILE_N`].
    tile_n: usize,
    tiles_m: usize,
    tiles_n: usize,
    /// Blocks along K; 1 means the tile kernel stores the result directly.
    splits: usize,
    /// The k each split covers (a multiple of BK); the last may cover less.
    k_chunk: usize,
}

impl GemmPlan {
    /// The plan for a non-empty output (`m, n ≥ 1`) in tiles of `tile`.
    pub(crate) fn new(
        op: &'static str,
        m: usize,
        n: usize,
        k: usize,
        tile: Fp32Tile,
    ) -> Result<Self> {
        let tile_m = tile_rows(m, n);
        let tiles_m = m.div_ceil(tile_m);
        // K is split as for the square tiles whatever tile runs, so that
        // the tile never changes the order of a sum.
        let square_tiles = tiles_m * n.div_ceil(TILE_ELEMS / tile_m);
        let wanted = TARGET_BLOCKS.div_ceil(square_tiles);
        let most = (k / MIN_K_CHUNK).max(1);
        let k_chunk = k.div_ceil(wanted.min(most)).next_multiple_of(BK).max(BK);
        let splits = k.div_ceil(k_chunk).max(1);
        let tile_n = match tile {
            Fp32Tile::Wide if tile_m == 64 && n >= WIDE_MIN_TILES_N * WIDE_TILE_N => WIDE_TILE_N,
            _ => TILE_ELEMS / tile_m,
        };
        let tiles_n = n.div_ceil(tile_n);
        let plan = Self {
            m,
            n,
            tile_m,
            tile_n,
            tiles_m,
            tiles_n,
            splits,
            k_chunk,
        };
        // The kernels index in 32 bits, the workspace included.
        let elements = m.checked_mul(n).and_then(|mn| mn.checked_mul(splits));
        let fits = tiles_m <= MAX_GRID_YZ
            && splits <= MAX_GRID_YZ
            && tiles_n <= i32::MAX as usize
            && k <= i32::MAX as usize
            && elements.is_some_and(|e| e <= i32::MAX as usize);
        if fits {
            Ok(plan)
        } else {
            Err(Error::InvalidArgument {
                op,
                reason: format!("a {m}x{n}x{k} product exceeds the 32-bit indexing of the kernels"),
            })
        }
    }

    /// Whether K is split: then the `_partial` kernel fills a workspace of
    /// [`Self::workspace_len`] and the `_reduce` kernel stores the result.
    pub(crate) fn is_split(&self) -> bool {
        self.splits > 1
    }

    pub(crate) fn workspace_len(&self) -> usize {
        self.splits * self.m * self.n
    }

    /// The launch of the tile kernels: x walks N tiles, y M tiles, z splits.
    pub(crate) fn tiles(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (self.tiles_n as u32, self.tiles_m as u32, self.splits as u32),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// The launch of the `_reduce` kernels: one thread per output element,
    /// or from [`WIDE_REDUCE_SPLITS`] splits a warp per element.
    pub(crate) fn reduce(&self) -> LaunchConfig {
        let per_block = if self.splits >= WIDE_REDUCE_SPLITS {
            THREADS as usize / 32
        } else {
            THREADS as usize
        };
        LaunchConfig {
            // At most 2³¹/8 blocks: `new` bounds m·n by i32::MAX.
            grid_dim: ((self.m * self.n).div_ceil(per_block) as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Whether this plan runs in the wide tiles (the `w` kernels).
    pub(crate) fn is_wide(&self) -> bool {
        self.tile_n == WIDE_TILE_N
    }

    /// The entry point of a family that runs `products` by this plan.
    pub(crate) fn variant(&self, products: Products) -> GemmVariant {
        GemmVariant::of(products, self.is_wide())
    }

    /// The kernels' parameter struct for this plan.
    pub(crate) fn args<G>(&self, geom: G) -> GemmLaunch<G> {
        GemmLaunch {
            geom,
            tiling: GemmTiling {
                k_chunk: self.k_chunk as u64,
                splits: self.splits as u64,
                tile_m: self.tile_m as u64,
                tile_n: self.tile_n as u64,
            },
        }
    }
}

/// A GEMM family of the table that stores `a·b`: tile kernels that store
/// the result, or split-K `_partial` ones that fill the workspace.
type Product<G> = unsafe fn(
    &Cuda,
    GemmVariant,
    LaunchConfig,
    In<'_, f32>,
    In<'_, f32>,
    Out<'_, f32>,
    Val<'_, GemmLaunch<G>>,
) -> Result<()>;
/// A `_reduce` kernel that adds a bias: two inputs and an output.
type BiasReduce<G> = unsafe fn(
    &Cuda,
    LaunchConfig,
    In<'_, f32>,
    In<'_, f32>,
    Out<'_, f32>,
    Val<'_, GemmLaunch<G>>,
) -> Result<()>;
/// A family of tile kernels that store `a·b` plus a bias per output row.
pub(crate) type BiasProduct<G> = unsafe fn(
    &Cuda,
    GemmVariant,
    LaunchConfig,
    In<'_, f32>,
    In<'_, f32>,
    In<'_, f32>,
    Out<'_, f32>,
    Val<'_, GemmLaunch<G>>,
) -> Result<()>;
/// A `_reduce` kernel: sums the workspace's splits into the result.
type Reduce<G> =
    unsafe fn(&Cuda, LaunchConfig, In<'_, f32>, Out<'_, f32>, Val<'_, GemmLaunch<G>>) -> Result<()>;
/// The kernels of one GEMM-based op direction, from the kernel table: the
/// tile kernel that stores the result, and the split-K pair.
pub(crate) struct GemmKernels<G: 'static> {
    pub whole: Product<G>,
    pub partial: Product<G>,
    pub reduce: Reduce<G>,
}

/// [`GemmKernels`] for a product with a bias per output row.
pub(crate) struct BiasGemmKernels<G: 'static> {
    pub whole: BiasProduct<G>,
    pub partial: Product<G>,
    /// `(workspace, bias, out, args)`.
    pub reduce: BiasReduce<G>,
}

/// How one GEMM stores its result, with the kernels that do it.
pub(crate) enum Store<'k, 'v, G: 'static> {
    Plain(&'k GemmKernels<G>),
    Bias(&'k BiasGemmKernels<G>, In<'v, f32>),
}

impl<G> Store<'_, '_, G> {
    fn partial(&self) -> Product<G> {
        match self {
            Self::Plain(k) => k.partial,
            Self::Bias(k, _) => k.partial,
        }
    }
}

impl Cuda {
    /// Computes `out` from `a` and `b` by `plan`: one tile kernel, or for a
    /// split K the partial kernel into a scratch workspace and the reduce
    /// kernel into `out`.
    ///
    /// # Safety
    ///
    /// `a`, `b`, the bias and `out` hold what the kernels index for `geom`
    /// (the op checked them against it), and `plan` is `geom`'s product.
    pub(crate) unsafe fn gemm<G>(
        &self,
        plan: &GemmPlan,
        geom: G,
        a: In<'_, f32>,
        b: In<'_, f32>,
        store: Store<'_, '_, G>,
        out: Out<'_, f32>,
    ) -> Result<()> {
        let variant = plan.variant(self.products());
        let args = plan.args(geom);
        if plan.is_split() {
            let mut ws = self.scratch(plan.workspace_len())?;
            // SAFETY: `a`, `b` as promised by the caller; `ws` holds
            // `workspace_len()` = splits·m·n elements, what the partial
            // kernel writes for this plan.
            unsafe { store.partial()(self, variant, plan.tiles(), a, b, &mut ws, &args)? };
            match store {
                // SAFETY: as above; the reduce kernel reads the same `ws`.
                Store::Plain(k) => unsafe { (k.reduce)(self, plan.reduce(), &ws, out, &args) },
                // SAFETY: as above, and the bias as promised.
                Store::Bias(k, bias) => unsafe {
                    (k.reduce)(self, plan.reduce(), &ws, bias, out, &args)
                },
            }
        } else {
            match store {
                // SAFETY: the caller's promise for every buffer.
                Store::Plain(k) => unsafe {
                    (k.whole)(self, variant, plan.tiles(), a, b, out, &args)
                },
                // SAFETY: the caller's promise for every buffer.
                Store::Bias(k, bias) => unsafe {
                    (k.whole)(self, variant, plan.tiles(), a, b, bias, out, &args)
                },
            }
        }
    }
}

/// Rejects buffers the kernels' 32-bit indices cannot address.
pub(crate) fn check_i32(op: &'static str, lens: &[usize]) -> Result<()> {
    match lens.iter().find(|&&len| len > i32::MAX as usize) {
        None => Ok(()),
        Some(len) => Err(Error::InvalidArgument {
            op,
            reason: format!("a buffer of {len} elements exceeds the kernels' 32-bit indexing"),
        }),
    }
}

#[cfg(test)]
#[path = "gemm_tests.rs"]
mod tests;
