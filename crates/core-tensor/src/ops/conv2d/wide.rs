//! Stride-1, unpadded convolution on "wide" rows (see [`crate::simd`]), per
//! image:
//!
//! * forward: `y[o][p] = b[o] + Σ_t W[o][t] · x[p + off_t]` over wide
//!   positions `p = oh·W + ow`, taps `t = (c, kh, kw)`, `off_t = (c·H + kh)·W + kw`;
//! * weight gradient: `dW[o][t] = Σ_p dy[o][p] · x[p + off_t]` over the real
//!   positions, with `dy` transposed so that output channels fill the lanes;
//! * input gradient: `dx[c][p + kh·W + kw] += Σ_o W[o][c][kh][kw] · dy[o][p]`,
//!   one correlation per kernel tap `(kh, kw)`, added tap by tap, over `dy`
//!   spread onto wide rows whose scratch columns are zero.
//!
//! No im2col copy, no GEMM packing. Each output is one chain from zero over
//! its reduction index, then added to its start value: the vector width
//! never changes a bit, and wherever `gemm` does not cut a sum into cache
//! blocks the two paths agree bit for bit.

use std::ops::Range;

use super::Conv2dGeom;
use crate::simd::{Block, Isa, TapSums, Taps};

#[cfg(test)]
#[path = "wide_tests.rs"]
mod tests;

/// Whether `g` runs on wide rows here: stride 1, no padding, a vector
/// instruction set, and offsets that fit the kernels' `u32`s.
pub(super) fn isa_for(g: &Conv2dGeom) -> Option<Isa> {
    let planes = g.in_channels.max(g.out_channels) + 1;
    let fits = planes.saturating_mul(g.in_h * g.in_w + 64) <= u32::MAX as usize;
    (g.stride == 1 && g.padding == 0 && fits)
        .then(Isa::detect)
        .flatten()
}

/// Whether `g`'s backward pass runs on wide rows too: as [`isa_for`], with
/// taps enough to fill the weight-gradient blocks. With few (conv1 has
/// nine, padded to twelve) transposing `dy` costs more than it saves:
/// conv1's backward measured 2.3 ms wide against 1.8 ms by im2col + GEMM.
pub(super) fn bwd_isa_for(g: &Conv2dGeom) -> Option<Isa> {
    isa_for(g).filter(|isa| g.patch_len() >= 4 * isa.taps())
}

/// Where one layer's wide rows lie, for both passes: the row length, the
/// forward taps' input offsets, and how far one image's kernels read.
pub(super) struct Layout {
    isa: Isa,
    g: Conv2dGeom,
    /// Wide positions per plane, whole blocks: the length of a wide row.
    len: usize,
    /// The forward taps `(c, kh, kw)`' input offsets, in that order.
    taps: Taps,
    /// Input elements one image's kernels read, from its first element.
    reach: usize,
}

impl Layout {
    pub fn new(isa: Isa, g: &Conv2dGeom) -> Self {
        let (k, width) = (g.kernel, g.in_w);
        let offsets: Vec<u32> = (0..g.in_channels)
            .flat_map(|c| (0..k).flat_map(move |kh| (0..k).map(move |kw| (c, kh, kw))))
            .map(|(c, kh, kw)| offset((c * g.in_h + kh) * width + kw))
            .collect();
        let taps = Taps::new(offsets);
        let len = ((g.out_h() - 1) * width + g.out_w()).next_multiple_of(isa.tile());
        Self {
            isa,
            g: *g,
            len,
            reach: taps.max() + len,
            taps,
        }
    }

    /// The image starting at `x[at]`, or a zero-padded copy in `padded` when
    /// the last blocks would read past the end of `x`.
    pub fn image<'a>(&self, x: &'a [f32], at: usize, padded: &'a mut Vec<f32>) -> &'a [f32] {
        let x = &x[at..];
        if x.len() >= self.reach {
            return x;
        }
        padded.clear();
        padded.extend_from_slice(&x[..self.g.in_image_len()]);
        padded.resize(self.reach, 0.0);
        padded
    }

    /// Each output row's place in `planes` planes `[OH][OW]` and on their
    /// wide rows (`len` apart, rows `W` apart): `(compact, wide)` ranges.
    fn rows(&self, planes: usize) -> impl Iterator<Item = (Range<usize>, Range<usize>)> {
        let (oh, ow, width, len) = (self.g.out_h(), self.g.out_w(), self.g.in_w, self.len);
        (0..planes * oh).map(move |r| {
            let (compact, wide) = (r * ow, (r / oh) * len + (r % oh) * width);
            (compact..compact + ow, wide..wide + ow)
        })
    }
}

/// Weights packed for [`Block`]s: `[block][tap][row]`, rows past the last
/// output channel zero.
struct Packed {
    w: Vec<f32>,
    out_channels: usize,
}

impl Packed {
    fn new(
        isa: Isa,
        taps: usize,
        out_channels: usize,
        weight: impl Fn(usize, usize) -> f32,
    ) -> Self {
        let rows = isa.rows();
        let mut w = vec![0.0; out_channels.div_ceil(rows) * taps * rows];
        for (b, block) in w.chunks_mut(taps * rows).enumerate() {
            for (t, tap) in block.chunks_mut(rows).enumerate() {
                for (r, v) in tap.iter_mut().enumerate() {
                    let o = b * rows + r;
                    if o < out_channels {
                        *v = weight(o, t);
                    }
                }
            }
        }
        Self { w, out_channels }
    }

    /// Runs every block over wide positions `[0, len)` of `x`, reading
    /// `taps`, into rows of `out` `stride` apart, shifted by `shift`; `init`
    /// per output channel (padded to whole blocks), or accumulating onto `out`.
    #[allow(clippy::too_many_arguments)]
    fn correlate(
        &self,
        isa: Isa,
        taps: &Taps,
        x: &[f32],
        len: usize,
        init: Option<&[f32]>,
        out: &mut [f32],
        stride: usize,
        shift: usize,
    ) {
        let rows = isa.rows();
        for (b, w) in self.w.chunks(taps.offsets().len() * rows).enumerate() {
            for at in (0..len).step_by(isa.tile()) {
                Block {
                    x,
                    x_at: at,
                    taps,
                    w,
                    init: init.map(|init| &init[b * rows..]),
                    out_at: b * rows * stride + at + shift,
                    out_stride: stride,
                }
                .run(isa, out);
            }
        }
    }

    fn padded_channels(&self, isa: Isa) -> usize {
        self.out_channels.next_multiple_of(isa.rows())
    }
}

/// One convolution layer's weights and bias, packed for the forward pass.
pub(super) struct Wide<'l> {
    layout: &'l Layout,
    weights: Packed,
    init: Vec<f32>,
}

impl<'l> Wide<'l> {
    pub fn new(layout: &'l Layout, w: &[f32], b: &[f32]) -> Self {
        let (isa, g) = (layout.isa, &layout.g);
        let (taps, patch) = (layout.taps.offsets().len(), g.patch_len());
        let weights = Packed::new(isa, taps, g.out_channels, |o, t| w[o * patch + t]);
        let mut init = b.to_vec();
        init.resize(weights.padded_channels(isa), 0.0);
        Self {
            layout,
            weights,
            init,
        }
    }

    /// One image's output `y` (`[O][OH][OW]`) from its input (see [`Layout::image`]).
    pub fn forward(&self, x: &[f32], scratch: &mut Vec<f32>, y: &mut [f32]) {
        let Layout { isa, len, .. } = *self.layout;
        scratch.resize(self.weights.padded_channels(isa) * len, 0.0);
        let (taps, init) = (&self.layout.taps, Some(self.init.as_slice()));
        self.weights
            .correlate(isa, taps, x, len, init, scratch, len, 0);
        for (compact, wide) in self.layout.rows(self.layout.g.out_channels) {
            y[compact].copy_from_slice(&scratch[wide]);
        }
    }
}

/// One layer's weights packed for the backward pass.
pub(super) struct WideBwd<'l> {
    layout: &'l Layout,
    /// The forward taps' input offsets, padded to whole [`TapSums`].
    taps: Vec<u32>,
    /// Output channels padded to whole [`TapSums`]: `dyt`'s row length.
    channels: usize,
    /// The output channels' wide rows: the input gradient's taps.
    dy_rows: Taps,
    /// Per kernel tap `(kh, kw)`, the transposed weights `W[·][c][kh][kw]`
    /// over [`Self::dy_rows`]; empty when `dx` is not wanted.
    dx: Vec<Packed>,
}

/// One thread's buffers for [`WideBwd::image`].
pub(super) struct BwdScratch {
    /// `dy` transposed, `[position][channel]`, padding channels zero.
    dyt: Vec<f32>,
    /// `dy` on wide rows, scratch columns zero (for `dx` only).
    dy: Vec<f32>,
    /// `dW` summed over this thread's images, `[taps padded][channels]`.
    dw: Vec<f32>,
    /// `dx` planes `dx_stride` apart.
    dx: Vec<f32>,
}

impl<'l> WideBwd<'l> {
    pub fn new(layout: &'l Layout, w: &[f32], with_dx: bool) -> Self {
        let (isa, g, len) = (layout.isa, &layout.g, layout.len);
        let mut taps = layout.taps.offsets().to_vec();
        taps.resize(taps.len().next_multiple_of(isa.taps()), 0);
        let (k, patch) = (g.kernel, g.patch_len());
        let dx = (0..k * k)
            .filter(|_| with_dx)
            .map(|tap| {
                Packed::new(isa, g.out_channels, g.in_channels, |c, o| {
                    w[o * patch + c * k * k + tap]
                })
            })
            .collect();
        Self {
            layout,
            taps,
            channels: g.out_channels.next_multiple_of(isa.channels()),
            dy_rows: Taps::new((0..g.out_channels).map(|o| offset(o * len)).collect()),
            dx,
        }
    }

    /// A `dx` plane's stride: room for the last tap's shift past `len`.
    fn dx_stride(&self) -> usize {
        let Layout { g, len, .. } = self.layout;
        len + (g.kernel - 1) * g.in_w + g.kernel - 1
    }

    pub fn layout(&self) -> &'l Layout {
        self.layout
    }

    pub fn scratch(&self) -> BwdScratch {
        let Layout { isa, g, len, .. } = self.layout;
        let with_dx = !self.dx.is_empty();
        let dx_rows = g.in_channels.next_multiple_of(isa.rows());
        let sized = |len: usize| vec![0.0; if with_dx { len } else { 0 }];
        BwdScratch {
            dyt: vec![0.0; g.out_h() * g.out_w() * self.channels],
            dy: sized(g.out_channels * len),
            dw: vec![0.0; self.taps.len() * self.channels],
            dx: sized(dx_rows * self.dx_stride()),
        }
    }

    /// Adds one image's `dW` into `s` and writes its `dx` when asked, from
    /// its input (see [`Layout::image`]) and output gradient.
    pub fn image(&self, x: &[f32], dy: &[f32], s: &mut BwdScratch, dx: Option<&mut [f32]>) {
        let Layout {
            isa, ref g, len, ..
        } = *self.layout;
        let channels = self.channels;
        let (oh, ow) = (g.out_h(), g.out_w());
        transpose(dy, oh * ow, &mut s.dyt, channels);
        let taps = isa.taps();
        for c in (0..channels).step_by(isa.channels()) {
            for t in (0..self.taps.len()).step_by(taps) {
                TapSums {
                    dyt: &s.dyt,
                    dy_at: c,
                    dy_stride: channels,
                    x,
                    offsets: &self.taps[t..t + taps],
                    rows: oh,
                    cols: ow,
                    width: g.in_w,
                    out_at: t * channels + c,
                    out_stride: channels,
                }
                .run(isa, &mut s.dw);
            }
        }
        let Some(dx) = dx else { return };
        for (compact, wide) in self.layout.rows(g.out_channels) {
            s.dy[wide].copy_from_slice(&dy[compact]);
        }
        s.dx.fill(0.0);
        let stride = self.dx_stride();
        let k = g.kernel;
        for (tap, packed) in self.dx.iter().enumerate() {
            let shift = (tap / k) * g.in_w + tap % k;
            let (taps, out) = (&self.dy_rows, &mut s.dx);
            packed.correlate(isa, taps, &s.dy, len, None, out, stride, shift);
        }
        let plane = g.in_h * g.in_w;
        for (dst, src) in dx.chunks_mut(plane).zip(s.dx.chunks(stride)) {
            dst.copy_from_slice(&src[..plane]);
        }
    }

    /// The weight gradient summed so far, `[O][C·K·K]`.
    pub fn dw_into(&self, s: &BwdScratch, dw: &mut [f32]) {
        for (o, row) in dw.chunks_mut(self.layout.g.patch_len()).enumerate() {
            for (t, v) in row.iter_mut().enumerate() {
                *v = s.dw[t * self.channels + o];
            }
        }
    }
}

/// `dyt[i][o] = dy[o][i]` for `positions` columns `i`, rows of `dyt`
/// `channels` long. Eight positions at a time: each plane's eight values
/// are one short run, and the eight rows they land in stay in L1 (element
/// by element, plane by plane, missed the cache on every write: conv1's
/// backward took 3.3 ms with it, 2.2 ms with this).
fn transpose(dy: &[f32], positions: usize, dyt: &mut [f32], channels: usize) {
    const RUN: usize = 8;
    for (block, rows) in dyt.chunks_mut(RUN * channels).enumerate() {
        let first = block * RUN;
        let run = RUN.min(positions - first);
        for (o, plane) in dy.chunks_exact(positions).enumerate() {
            for (j, &v) in plane[first..first + run].iter().enumerate() {
                rows[j * channels + o] = v;
            }
        }
    }
}

/// An input offset; [`isa_for`] keeps every layer's within `u32`.
fn offset(at: usize) -> u32 {
    u32::try_from(at).expect("isa_for checked the layer size")
}
