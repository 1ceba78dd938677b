//! The host side of the shared SGEMM tile (`sgemm.cuh`): its launch struct
//! and the split-K plan.
//!
//! The plan is a function of the GEMM's shape alone, never of the device, so
//! the order of every sum — and hence every result bit — is the same run to
//! run and on every GPU.

use cudarc::driver::LaunchConfig;

use super::launch::{In, Out, Val};

use crate::{Cuda, Error, MatmulPrecision, Result};

/// The tiles; mirror `GEMM_BK`, `GEMM_THREADS` and `GEMM_TILE_ELEMS` in
/// sgemm.cuh. A tile has `tile_m` rows (64, or 32 for short products) and
/// `TILE_ELEMS / tile_m` columns.
const BK: usize = 16;
const THREADS: u32 = 256;
const TILE_ELEMS: usize = 4096;

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
/// The least k one split covers (16 tiles of BK), so that writing and
/// re-reading the partial tiles stays cheap next to the arithmetic.
const MIN_K_CHUNK: usize = 256;
/// From this many splits a warp sums each element; mirrors
/// `GEMM_WIDE_REDUCE_SPLITS` in sgemm.cuh.
const WIDE_REDUCE_SPLITS: usize = 32;
/// The grid's y (M tiles) and z (splits) limit.
const MAX_GRID_YZ: usize = 65_535;

/// The parameter struct of every GEMM kernel: the op's geometry plus the
/// tiling. Mirrored by `Conv2dLaunch` and `LinearLaunch` in the .cu files.
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub(crate) struct GemmLaunch<G> {
    pub geom: G,
    pub tiling: GemmTiling,
}

/// How one product is cut into blocks; mirrored by `GemmTiling` in
/// sgemm.cuh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct GemmTiling {
    pub k_chunk: u64,
    pub splits: u64,
    pub tile_m: u64,
}

/// How one `M × N × K` product is cut into blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GemmPlan {
    m: usize,
    n: usize,
    /// Rows of one tile (32 or 64); its columns are `TILE_ELEMS / tile_m`.
    tile_m: usize,
    tiles_m: usize,
    tiles_n: usize,
    /// Blocks along K; 1 means the tile kernel stores the result directly.
    splits: usize,
    /// The k each split covers (a multiple of BK); the last may cover less.
    k_chunk: usize,
}

impl GemmPlan {
    /// The plan for a non-empty output (`m, n ≥ 1`).
    pub(crate) fn new(op: &'static str, m: usize, n: usize, k: usize) -> Result<Self> {
        let tile_m = tile_rows(m, n);
        let tiles_m = m.div_ceil(tile_m);
        let tiles_n = n.div_ceil(TILE_ELEMS / tile_m);
        let wanted = TARGET_BLOCKS.div_ceil(tiles_m * tiles_n);
        let most = (k / MIN_K_CHUNK).max(1);
        let k_chunk = k.div_ceil(wanted.min(most)).next_multiple_of(BK).max(BK);
        let splits = k.div_ceil(k_chunk).max(1);
        let plan = Self {
            m,
            n,
            tile_m,
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

    /// The kernels' parameter struct for this plan.
    pub(crate) fn args<G>(&self, geom: G) -> GemmLaunch<G> {
        GemmLaunch {
            geom,
            tiling: GemmTiling {
                k_chunk: self.k_chunk as u64,
                splits: self.splits as u64,
                tile_m: self.tile_m as u64,
            },
        }
    }
}

/// A GEMM kernel of the table that stores `a·b`: a tile kernel that stores
/// the result, or a split-K `_partial` one that fills the workspace (or a
/// `_reduce` kernel that adds a bias: two inputs and an output too).
type Product<G> = unsafe fn(
    &Cuda,
    LaunchConfig,
    In<'_, f32>,
    In<'_, f32>,
    Out<'_, f32>,
    Val<'_, GemmLaunch<G>>,
) -> Result<()>;
/// A tile kernel that stores `a·b` plus a bias per output row.
type BiasProduct<G> = unsafe fn(
    &Cuda,
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
/// A tile kernel's two entry points: `_f32` (CUDA cores) and `_tf32`
/// (tensor cores).
#[derive(Clone, Copy)]
pub(crate) struct ByPrecision<K> {
    pub fp32: K,
    pub tf32: K,
}

impl<K: Copy> ByPrecision<K> {
    fn pick(&self, precision: MatmulPrecision) -> K {
        match precision {
            MatmulPrecision::Fp32 => self.fp32,
            MatmulPrecision::Tf32 => self.tf32,
        }
    }
}

/// The kernels of one GEMM-based op direction, from the kernel table: the
/// tile kernel that stores the result, and the split-K pair.
pub(crate) struct GemmKernels<G: 'static> {
    pub whole: ByPrecision<Product<G>>,
    pub partial: ByPrecision<Product<G>>,
    pub reduce: Reduce<G>,
}

/// [`GemmKernels`] for a product with a bias per output row.
pub(crate) struct BiasGemmKernels<G: 'static> {
    pub whole: ByPrecision<BiasProduct<G>>,
    pub partial: ByPrecision<Product<G>>,
    /// `(workspace, bias, out, args)`: the shape of a [`Product`].
    pub reduce: Product<G>,
}

/// How one GEMM stores its result, with the kernels that do it.
pub(crate) enum Store<'k, 'v, G: 'static> {
    Plain(&'k GemmKernels<G>),
    Bias(&'k BiasGemmKernels<G>, In<'v, f32>),
}

impl<G> Store<'_, '_, G> {
    fn partial(&self) -> ByPrecision<Product<G>> {
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
        let args = plan.args(geom);
        let precision = self.matmul_precision();
        if plan.is_split() {
            let mut ws = self.scratch(plan.workspace_len())?;
            // SAFETY: `a`, `b` as promised by the caller; `ws` holds
            // `workspace_len()` = splits·m·n elements, what the partial
            // kernel writes for this plan.
            unsafe { store.partial().pick(precision)(self, plan.tiles(), a, b, &mut ws, &args)? };
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
                    k.whole.pick(precision)(self, plan.tiles(), a, b, out, &args)
                },
                // SAFETY: the caller's promise for every buffer.
                Store::Bias(k, bias) => unsafe {
                    k.whole.pick(precision)(self, plan.tiles(), a, b, bias, out, &args)
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
mod tests {
    use super::*;

    fn covers_k_exactly(plan: &GemmPlan, k: usize) {
        assert_eq!(plan.k_chunk % BK, 0, "{plan:?}");
        assert!(
            plan.splits * plan.k_chunk >= k,
            "{plan:?} misses part of k = {k}"
        );
        assert!(
            k == 0 || (plan.splits - 1) * plan.k_chunk < k,
            "{plan:?}: the last split of k = {k} is empty"
        );
    }

    #[test]
    fn a_long_k_behind_few_tiles_is_split() {
        // conv2's weight gradient at batch 64: 64 x 288 outputs, K = 64·24·24.
        let k = 64 * 24 * 24;
        let plan = GemmPlan::new("test", 64, 288, k).unwrap();
        assert!(plan.is_split());
        assert!(plan.k_chunk >= MIN_K_CHUNK);
        let blocks = plan.tiles_m * plan.tiles_n * plan.splits;
        assert!(
            (TARGET_BLOCKS..2 * TARGET_BLOCKS).contains(&blocks),
            "{plan:?}"
        );
        covers_k_exactly(&plan, k);
        assert_eq!(plan.workspace_len(), plan.splits * 64 * 288);
    }

    #[test]
    fn many_tiles_or_a_short_k_stay_whole() {
        // conv2's forward pass at batch 64: 64 x 36864 outputs, K = 288.
        let plan = GemmPlan::new("test", 64, 64 * 24 * 24, 288).unwrap();
        assert!(!plan.is_split());
        covers_k_exactly(&plan, 288);
        // fc2: a single tile, but K = 128 is below one minimum chunk.
        let plan = GemmPlan::new("test", 64, 10, 128).unwrap();
        assert!(!plan.is_split());
        covers_k_exactly(&plan, 128);
    }

    #[test]
    fn short_wide_products_take_the_32_row_tile() {
        // conv2's input gradient at batch 64: 32 channels x 64·26·26 pixels.
        let plan = GemmPlan::new("test", 32, 64 * 26 * 26, 576).unwrap();
        assert_eq!(plan.tile_m, 32);
        assert_eq!(
            plan.tiles().grid_dim,
            ((64 * 26 * 26usize).div_ceil(128) as u32, 1, 1)
        );
        assert_eq!(plan.args(()).tiling.tile_m, 32);
        // 33 rows, or an output too narrow for 128 columns, keep 64 x 64.
        assert_eq!(GemmPlan::new("test", 33, 10_000, 16).unwrap().tile_m, 64);
        assert_eq!(GemmPlan::new("test", 32, 64, 16).unwrap().tile_m, 64);
    }

    #[test]
    fn a_long_reduce_takes_a_warp_per_element() {
        // conv1's weight gradient at batch 64: 32 x 9 outputs, K = 64·26·26.
        let plan = GemmPlan::new("test", 32, 9, 64 * 26 * 26).unwrap();
        assert!(plan.splits >= WIDE_REDUCE_SPLITS, "{plan:?}");
        assert_eq!(
            plan.reduce().grid_dim,
            ((32 * 9usize).div_ceil(8) as u32, 1, 1)
        );
        // A short chain keeps a thread per element.
        let plan = GemmPlan::new("test", 64, 288, 4 * 24 * 24).unwrap();
        assert!(
            plan.is_split() && plan.splits < WIDE_REDUCE_SPLITS,
            "{plan:?}"
        );
        assert_eq!(
            plan.reduce().grid_dim,
            ((64 * 288usize).div_ceil(256) as u32, 1, 1)
        );
    }

    #[test]
    fn empty_k_runs_one_split() {
        let plan = GemmPlan::new("test", 3, 5, 0).unwrap();
        assert_eq!((plan.splits, plan.k_chunk), (1, BK));
        assert_eq!(plan.tiles().grid_dim, (1, 1, 1));
    }

    #[test]
    fn the_plan_covers_k_for_every_shape() {
        for m in [1, 63, 64, 65, 200] {
            for n in [1, 64, 1000] {
                for k in [1, 15, 16, 17, 255, 256, 257, 5000, 100_000] {
                    covers_k_exactly(&GemmPlan::new("test", m, n, k).unwrap(), k);
                }
            }
        }
    }

    #[test]
    fn products_beyond_32_bit_indexing_are_refused() {
        let err = GemmPlan::new("test", 1 << 16, 1 << 16, 16).unwrap_err();
        assert!(err.to_string().contains("32-bit"), "{err}");
        assert!(check_i32("test", &[1 << 31]).is_err());
        assert!(check_i32("test", &[(1 << 31) - 1]).is_ok());
    }
}
