//! Winograd F(2×2, 3×3) for the forward pass of the CPU's 3×3, stride-1
//! convolutions (Lavin & Gray, 2015): each 2×2 block of outputs comes from
//! a 4×4 input tile, and its 36 products become 16 in a transformed domain,
//! one GEMM per tile position over all channels, 2.25× fewer
//! multiplications than im2col + GEMM:
//!
//! ```text
//! Y = Aᵀ [ U ⊙ V ] A        U = G w Gᵀ,  V = Bᵀ d B
//! ```
//!
//! Outputs past an odd edge are computed and dropped, inputs past the
//! border (padding, or a partial tile) read zero. The constants are 0, ±1
//! and ½, so the transforms round little: on CNN_MNIST's conv2 shape the
//! largest error against the f64 definition, relative to the largest
//! magnitude, was 2.2e-7, where im2col + GEMM gave 6.5e-7 (the op's tests
//! hold it under 1e-5).
//!
//! The backward pass stays im2col + GEMM. Its Winograd forms were tried:
//! the input gradient `B [Uᵀ · A dY Aᵀ] Bᵀ` measured slower than the direct
//! GEMM here, and the weight gradient `Gᵀ [Σ dM · Vᵀ] G` turns the exact
//! zeros of a direct sum (weights whose products `dy·x` are all zero, which
//! ReLU and max-pool leave) into rounding noise that Adam scales up to
//! whole steps: 2 ranks × 32 drifted 2e-3 from 1 rank × 64 in 20 steps
//! (ddp_equivalence), against 3e-7 with the direct sum.
//!
//! Buffers hold one image as `[16 tile positions][channels][tiles]`: each
//! position's product is one GEMM; transforms run a row of tiles at a time.

use super::Conv2dGeom;
use crate::gemm::{MatMut, MatRef, matmul};

/// Positions in a transformed 4×4 tile.
const POS: usize = 16;

/// Whether `g` runs on this path: a 3×3 kernel, stride 1, and more than one
/// input channel (with one, the GEMMs would have an inner dimension of 1).
pub(super) fn applies(g: &Conv2dGeom) -> bool {
    g.kernel == 3 && g.stride == 1 && g.in_channels > 1
}

/// Elements of the transformed weights.
pub(super) fn weight_len(g: &Conv2dGeom) -> usize {
    POS * g.out_channels * g.in_channels
}

/// `f` applied to every row of `m`, then to every column of the result:
/// `L m Lᵀ` for the linear map `L` that `f` computes.
fn sandwich<const I: usize, const O: usize>(
    m: &[[f32; I]; I],
    f: impl Fn([f32; I]) -> [f32; O],
) -> [[f32; O]; O] {
    let rows: [[f32; O]; I] = m.map(&f);
    let mut out = [[0.0; O]; O];
    for j in 0..O {
        let col = f(std::array::from_fn(|i| rows[i][j]));
        for (a, v) in col.into_iter().enumerate() {
            out[a][j] = v;
        }
    }
    out
}

/// `G k`: kernel column to tile.
fn g_of([a, b, c]: [f32; 3]) -> [f32; 4] {
    [a, 0.5 * (a + b + c), 0.5 * (a - b + c), c]
}
/// `Bᵀ d`: input tile to transformed tile.
fn bt_of([a, b, c, d]: [f32; 4]) -> [f32; 4] {
    [a - c, b + c, c - b, b - d]
}
/// `Aᵀ m`: transformed tile to 2×2 outputs.
fn at_of([a, b, c, d]: [f32; 4]) -> [f32; 2] {
    [a + b + c, b - c - d]
}
/// `U = G w Gᵀ` for every (output, input) channel pair, `[16][O][C]`:
/// computed once per call and shared by every image.
pub(super) fn transform_weights(g: &Conv2dGeom, w: &[f32]) -> Vec<f32> {
    let (o_n, c_n) = (g.out_channels, g.in_channels);
    let mut u = vec![0.0; weight_len(g)];
    for (oc, k) in w.chunks_exact(9).enumerate() {
        let k: [[f32; 3]; 3] = std::array::from_fn(|r| std::array::from_fn(|s| k[3 * r + s]));
        let t = sandwich(&k, g_of);
        for (p, v) in t.as_flattened().iter().enumerate() {
            u[p * o_n * c_n + oc] = *v;
        }
    }
    u
}

/// `out[k·len + i] = f(ins[·][i])[k]` for every lane `i < len`: one of the
/// transforms above applied to a whole row of tiles at once, in blocks of
/// [`LANES`] fixed-size arrays, so that the compiler vectorizes them. `len`
/// is a multiple of [`LANES`] (rows are padded to it).
#[inline(always)]
fn lanes<const I: usize, const O: usize>(
    out: &mut [f32],
    ins: [&[f32]; I],
    len: usize,
    f: impl Fn([f32; I]) -> [f32; O],
) {
    for start in (0..len).step_by(LANES) {
        let mut x = [[0.0f32; LANES]; I];
        for (x, src) in x.iter_mut().zip(&ins) {
            x.copy_from_slice(&src[start..start + LANES]);
        }
        let mut y = [[0.0f32; LANES]; O];
        for l in 0..LANES {
            let r = f(std::array::from_fn(|j| x[j][l]));
            for k in 0..O {
                y[k][l] = r[k];
            }
        }
        for (k, y) in y.iter().enumerate() {
            out[k * len + start..k * len + start + LANES].copy_from_slice(y);
        }
    }
}

/// Lanes per block of [`lanes`]: one AVX2 vector.
const LANES: usize = 8;

/// Copies `src` onto `dst` in whole blocks of [`LANES`].
fn copy_blocks(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.chunks_exact_mut(LANES).zip(src.chunks_exact(LANES)) {
        d.copy_from_slice(s);
    }
}

/// The `len`-long rows `at` of a buffer of rows, as an array of slices.
fn rows_of<const N: usize>(buf: &[f32], len: usize, at: [usize; N]) -> [&[f32]; N] {
    at.map(|r| &buf[r * len..(r + 1) * len])
}

/// Splits row `ih` of a plane (zero outside the image) into the even and
/// odd input columns of consecutive tiles: `edge = [even (n) | odd (n)]`,
/// with `even[k] = row[2k − pad]`, `odd[k] = row[2k + 1 − pad]`.
fn split_row(plane: &[f32], width: usize, ih: Option<usize>, pad: usize, edge: &mut [f32]) {
    let n = edge.len() / 2;
    let Some(ih) = ih else {
        edge.fill(0.0);
        return;
    };
    let row = &plane[ih * width..(ih + 1) * width];
    let (even, odd) = edge.split_at_mut(n);
    let mut done = 0;
    if pad == 0 {
        for ((e, o), pair) in even.iter_mut().zip(odd.iter_mut()).zip(row.chunks_exact(2)) {
            (*e, *o) = (pair[0], pair[1]);
            done += 1;
        }
    }
    for k in done..n {
        let at = |col: usize| col.checked_sub(pad).and_then(|c| row.get(c)).copied();
        even[k] = at(2 * k).unwrap_or(0.0);
        odd[k] = at(2 * k + 1).unwrap_or(0.0);
    }
}

/// The input row under row `r` of the tiles in tile row `ti`, if inside.
fn in_row(g: &Conv2dGeom, ti: usize, r: usize) -> Option<usize> {
    (2 * ti + r)
        .checked_sub(g.padding)
        .filter(|&ih| ih < g.in_h)
}

/// Where things are in the per image buffers. A row of tiles is handled
/// `lanes` (the tiles per row, padded to a multiple of [`LANES`]) at a
/// time; each tile position's `[rows][T]` slab is followed by [`LANES`]
/// spare elements, so that a padded tile row can be read or written past
/// the last tile (the spare lanes are computed and never used).
#[derive(Clone, Copy)]
struct Tiling {
    th: usize,
    tw: usize,
    lanes: usize,
    t_n: usize,
}

impl Tiling {
    fn of(g: &Conv2dGeom) -> Self {
        // 2×2 output tiles per image: rows and columns.
        let (th, tw) = (g.out_h().div_ceil(2), g.out_w().div_ceil(2));
        Self {
            th,
            tw,
            lanes: tw.next_multiple_of(LANES),
            t_n: th * tw,
        }
    }
    /// Elements from one tile position's slab to the next, for `rows` channels.
    fn slab(&self, rows: usize) -> usize {
        rows * self.t_n + LANES
    }
    /// The 16 padded rows of tile row `ti` of channel `ch`.
    fn tile_row<'a>(&self, buf: &'a [f32], rows: usize, ch: usize, ti: usize) -> [&'a [f32]; 16] {
        let at = ch * self.t_n + ti * self.tw;
        std::array::from_fn(|p| &buf[p * self.slab(rows) + at..][..self.lanes])
    }
    /// Stores the tile row `b` (`[col][row]` order, as the transforms leave
    /// it) into the slabs of `buf` at channel `ch`, tile row `ti`.
    fn store(&self, buf: &mut [f32], rows: usize, ch: usize, ti: usize, b: &[f32]) {
        let at = ch * self.t_n + ti * self.tw;
        for (p, dst) in buf.chunks_exact_mut(self.slab(rows)).enumerate() {
            let src = (4 * (p % 4) + p / 4) * self.lanes;
            copy_blocks(&mut dst[at..at + self.lanes], &b[src..src + self.lanes]);
        }
    }
    /// The row-major `[rows][T]` matrix of tile position `p`.
    fn matrix<'a>(&self, buf: &'a [f32], rows: usize, p: usize) -> MatRef<'a> {
        let start = p * self.slab(rows);
        MatRef::row_major(&buf[start..start + rows * self.t_n], rows, self.t_n)
    }
}

/// One image's transformed input `V = Bᵀ d B`, a tile row at a time.
/// Tile rows are written in order, so each padded write's spare lanes are
/// overwritten by the next row, or land in the slab's spare elements.
fn transform_input(g: &Conv2dGeom, t: &Tiling, x: &[f32], v: &mut [f32], r: &mut RowScratch) {
    let w = t.lanes;
    for (c, plane) in x.chunks_exact(g.in_h * g.in_w).enumerate() {
        for ti in 0..t.th {
            for row in 0..4 {
                split_row(plane, g.in_w, in_row(g, ti, row), g.padding, &mut r.edge);
                let (even, odd) = r.edge.split_at(w + 1);
                let ins = [&even[..w], &odd[..w], &even[1..], &odd[1..]];
                lanes(&mut r.a[4 * row * w..], ins, w, bt_of);
            }
            for col in 0..4 {
                let ins = rows_of(&r.a, w, [col, 4 + col, 8 + col, 12 + col]);
                lanes(&mut r.b[4 * col * w..], ins, w, bt_of);
            }
            t.store(v, g.in_channels, c, ti, &r.b);
        }
    }
}

/// Per tile row scratch of the transforms.
struct RowScratch {
    /// A row split into even and odd columns, `2 × (lanes + 1)`.
    edge: Vec<f32>,
    /// The transform's first (row) stage, `16 × lanes`.
    a: Vec<f32>,
    /// Its second (column) stage, `16 × lanes`.
    b: Vec<f32>,
}

/// Scratch for one group of images, reused image after image.
pub(super) struct Scratch {
    tiling: Tiling,
    /// Transformed input (or its gradient), `[16][C][T]` slabs.
    v: Vec<f32>,
    /// Transformed output (or its gradient), `[16][O][T]` slabs.
    m: Vec<f32>,
    rows: RowScratch,
}

impl Scratch {
    pub fn new(g: &Conv2dGeom) -> Self {
        let t = Tiling::of(g);
        Self {
            tiling: t,
            v: vec![0.0; POS * t.slab(g.in_channels)],
            m: vec![0.0; POS * t.slab(g.out_channels)],
            rows: RowScratch {
                edge: vec![0.0; 2 * (t.lanes + 1)],
                a: vec![0.0; POS * t.lanes],
                b: vec![0.0; POS * t.lanes],
            },
        }
    }
}

/// `y = conv(x, w) + b` for one image, with `u` from [`transform_weights`].
pub(super) fn forward_image(
    g: &Conv2dGeom,
    u: &[f32],
    b: &[f32],
    x: &[f32],
    y: &mut [f32],
    s: &mut Scratch,
) {
    let (t, r) = (s.tiling, &mut s.rows);
    let (o_n, c_n, w) = (g.out_channels, g.in_channels, t.lanes);
    transform_input(g, &t, x, &mut s.v, r);
    for (p, m) in s.m.chunks_exact_mut(t.slab(o_n)).enumerate() {
        matmul(
            MatMut::row_major(m, o_n, t.t_n),
            false,
            MatRef::row_major(&u[p * o_n * c_n..(p + 1) * o_n * c_n], o_n, c_n),
            t.matrix(&s.v, c_n, p),
            gemm::Parallelism::None,
        );
    }
    let (oh_n, ow_n) = (g.out_h(), g.out_w());
    for ((o, plane), &bias) in y.chunks_exact_mut(oh_n * ow_n).enumerate().zip(b) {
        for ti in 0..t.th {
            // M A per tile row, then Aᵀ (M A): r.b[(2·col + row)·w + tj].
            let m = t.tile_row(&s.m, o_n, o, ti);
            for i in 0..4 {
                let ins = [m[4 * i], m[4 * i + 1], m[4 * i + 2], m[4 * i + 3]];
                lanes(&mut r.a[2 * i * w..], ins, w, at_of);
            }
            for col in 0..2 {
                let ins = rows_of(&r.a, w, [col, 2 + col, 4 + col, 6 + col]);
                lanes(&mut r.b[2 * col * w..], ins, w, at_of);
            }
            for row in (0..2).filter(|row| 2 * ti + row < oh_n) {
                let out = &mut plane[(2 * ti + row) * ow_n..][..ow_n];
                let (even, odd) = (&r.b[row * w..][..t.tw], &r.b[(2 + row) * w..][..t.tw]);
                let mut pairs = out.chunks_exact_mut(2);
                for ((pair, e), o) in pairs.by_ref().zip(even).zip(odd) {
                    (pair[0], pair[1]) = (e + bias, o + bias);
                }
                if let [last] = pairs.into_remainder() {
                    *last = even[t.tw - 1] + bias;
                }
            }
        }
    }
}
