//! Hand-vectorized convolution microkernels, chosen at run time by the CPU's
//! instruction set; with [`crate::gemm`] and dropout's mask loops
//! (`ops/dropout/mask.rs`, compiled per instruction set and chosen the same
//! way) the only `unsafe` on the CPU path.
//!
//! Both kernels work on "wide" rows: a stride-1, unpadded convolution over
//! planes `W` elements wide reads input element `p + offset(c, kh, kw)` for
//! output position `p = oh·W + ow`, so the output is computed at every `p` of
//! a row, `W − OW` of them scratch. One contiguous vector load then feeds a
//! whole register block, with no im2col copy and no packing of the input.
//! The weight gradient sums over positions instead, with the output channels
//! in the vector lanes. The safe wrappers here check every index a kernel
//! derives before calling it; `x86` holds the kernels.

#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

/// The vector instruction set the kernels use on this CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    /// 16-lane AVX-512F.
    Avx512,
    /// 8-lane AVX2 with FMA.
    Avx2,
    /// The AVX-512 kernels' shapes in pairs of AVX2 vectors: the tests run
    /// the 16-lane code paths on a CPU without AVX-512.
    #[cfg(test)]
    Emu16,
}

impl Isa {
    /// The best instruction set this CPU has, or `None` (the im2col + GEMM
    /// path then runs, as on any other architecture).
    pub fn detect() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Some(Self::Avx512);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Some(Self::Avx2);
            }
        }
        None
    }

    /// Every instruction set this CPU can run the kernels of: its own, and
    /// the 16-lane shapes in pairs of AVX2 vectors (so an AVX2 machine tests
    /// the AVX-512 kernels' blocking, tails and padding). Says so when
    /// there is none.
    #[cfg(test)]
    pub fn testable() -> Vec<Self> {
        let mut isas: Vec<Self> = Self::detect().into_iter().collect();
        if isas == [Self::Avx2] {
            isas.push(Self::Emu16);
        }
        if isas.is_empty() {
            eprintln!("SKIPPED: this CPU has no AVX2; the im2col + GEMM path runs instead");
        }
        isas
    }

    fn wide(self) -> bool {
        self != Self::Avx2
    }

    /// Floats per vector.
    pub fn lanes(self) -> usize {
        if self.wide() { 16 } else { 8 }
    }

    /// Output channels of one [`Block`].
    pub fn rows(self) -> usize {
        if self.wide() { 8 } else { 6 }
    }

    /// Wide positions of one [`Block`].
    pub fn tile(self) -> usize {
        if self.wide() { 48 } else { 16 }
    }

    /// Taps of one [`TapSums`].
    pub fn taps(self) -> usize {
        if self.wide() { 12 } else { 6 }
    }

    /// Output channels of one [`TapSums`] (two vectors).
    pub fn channels(self) -> usize {
        2 * self.lanes()
    }
}

/// The input offsets of a correlation's taps, with the largest of them.
pub(crate) struct Taps {
    offsets: Vec<u32>,
    max: usize,
}

impl Taps {
    pub fn new(offsets: Vec<u32>) -> Self {
        let max = offsets.iter().max().map_or(0, |&o| o as usize);
        Self { offsets, max }
    }

    pub fn offsets(&self) -> &[u32] {
        &self.offsets
    }

    pub fn max(&self) -> usize {
        self.max
    }
}

/// One register block of a wide correlation: `rows()` output channels at
/// `tile()` consecutive wide positions starting at `x_at`,
/// `out[out_at + r·out_stride + j] = start_r + Σ_k w[k·rows + r] · x[x_at + taps[k] + j]`,
/// where `start_r` is `init[r]`, or with no `init` what `out` held there,
/// added after the sum (taken in tap order).
pub(crate) struct Block<'a> {
    pub x: &'a [f32],
    pub x_at: usize,
    pub taps: &'a Taps,
    /// Packed weights, `[tap][row]`.
    pub w: &'a [f32],
    pub init: Option<&'a [f32]>,
    pub out_at: usize,
    pub out_stride: usize,
}

impl Block<'_> {
    /// Runs the block on `isa`.
    ///
    /// # Panics
    /// When an index the kernel would use lies outside its slice: callers
    /// size every buffer, so this is a bug and must not become a wild read.
    pub fn run(&self, isa: Isa, out: &mut [f32]) {
        let (rows, tile) = (isa.rows(), isa.tile());
        assert!(
            self.x_at + self.taps.max + tile <= self.x.len(),
            "wide block reads past its input"
        );
        assert!(self.w.len() >= self.taps.offsets.len() * rows);
        assert!(self.init.is_none_or(|init| init.len() >= rows));
        assert!(
            self.out_at + (rows - 1) * self.out_stride + tile <= out.len(),
            "wide block writes past its output"
        );
        let init = self.init.map_or(std::ptr::null(), <[f32]>::as_ptr);
        #[cfg(target_arch = "x86_64")]
        {
            let x = self.x[self.x_at..].as_ptr();
            let (w, o) = (self.w.as_ptr(), out[self.out_at..].as_mut_ptr());
            let (offsets, stride) = (self.taps.offsets(), self.out_stride);
            // SAFETY: `detect` found the instruction set (the emulation needs
            // AVX2 only, and its tests check for it); the asserts above bound
            // every read (x_at + offset + lane < x.len()), weight index and
            // write, and `init` is null or holds a value per row.
            unsafe {
                match isa {
                    Isa::Avx512 => x86::block_avx512(x, offsets, w, init, o, stride),
                    Isa::Avx2 => x86::block_avx2(x, offsets, w, init, o, stride),
                    #[cfg(test)]
                    Isa::Emu16 => x86::block_emu16(x, offsets, w, init, o, stride),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("Isa::detect finds no wide kernels on this architecture");
    }
}

/// One register block of a weight gradient: for [`Isa::taps`] taps `t` and
/// [`Isa::channels`] output channels `j`,
/// `out[out_at + t·out_stride + j] += Σ_i dyt[dy_at + i·dy_stride + j] · x[offsets[t] + oh·width + ow]`
/// over positions `i = oh·cols + ow` (`oh < rows`, `ow < cols`), in order.
pub(crate) struct TapSums<'a> {
    pub dyt: &'a [f32],
    pub dy_at: usize,
    pub dy_stride: usize,
    pub x: &'a [f32],
    pub offsets: &'a [u32],
    pub rows: usize,
    pub cols: usize,
    pub width: usize,
    pub out_at: usize,
    pub out_stride: usize,
}

impl TapSums<'_> {
    /// Runs the block on `isa`.
    ///
    /// # Panics
    /// As [`Block::run`].
    pub fn run(&self, isa: Isa, out: &mut [f32]) {
        let (taps, channels) = (isa.taps(), isa.channels());
        assert!(self.offsets.len() == taps && self.cols <= self.width);
        assert!(
            self.out_at + (taps - 1) * self.out_stride + channels <= out.len(),
            "weight-gradient block writes past its output"
        );
        if self.rows == 0 || self.cols == 0 {
            return;
        }
        let last = self.rows * self.cols - 1;
        assert!(
            self.dy_at + last * self.dy_stride + channels <= self.dyt.len(),
            "weight-gradient block reads past its output gradient"
        );
        let max = self.offsets.iter().max().map_or(0, |&o| o as usize);
        assert!(
            max + (self.rows - 1) * self.width + self.cols <= self.x.len(),
            "weight-gradient block reads past its input"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let d = self.dyt[self.dy_at..].as_ptr();
            let (x, offsets) = (self.x.as_ptr(), self.offsets.as_ptr());
            let o = out[self.out_at..].as_mut_ptr();
            let plane = (self.rows, self.cols, self.width);
            let (ds, os) = (self.dy_stride, self.out_stride);
            // SAFETY: as in `Block::run`: the instruction set is there, and
            // the asserts above bound every position's reads and the writes.
            unsafe {
                match isa {
                    Isa::Avx512 => x86::taps_avx512(d, ds, x, offsets, plane, o, os),
                    Isa::Avx2 => x86::taps_avx2(d, ds, x, offsets, plane, o, os),
                    #[cfg(test)]
                    Isa::Emu16 => x86::taps_emu16(d, ds, x, offsets, plane, o, os),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("Isa::detect finds no wide kernels on this architecture");
    }
}
