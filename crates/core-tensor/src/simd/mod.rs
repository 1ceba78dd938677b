//! Hand-vectorized convolution microkernels, chosen at run time by the CPU's
//! instruction set; with [`crate::gemm`] the only `unsafe` on the CPU path.
//!
//! Both kernels work on "wide" rows: a stride-1, unpadded convolution over
//! planes `W` elements wide reads input element `p + offset(c, kh, kw)` for
//! output position `p = oh·W + ow`, so the output is computed at every `p` of
//! a row, `W − OW` of them scratch. One contiguous vector load then feeds a
//! whole register block, with no im2col copy and no packing of the input.
//! The safe wrappers here check every index a kernel derives before calling
//! it; `x86` holds the kernels.

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

    /// Output channels of one [`Reduce`].
    pub fn reduce_rows(self) -> usize {
        if self.wide() { 4 } else { 2 }
    }

    /// Taps of one [`Reduce`].
    pub const REDUCE_TAPS: usize = 6;
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
/// where `start_r` is `init[r]`, or with no `init` what `out` held there.
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

/// One register block of a wide reduction: for `reduce_rows()` rows `r` of
/// `a` and [`Isa::REDUCE_TAPS`] taps `t`,
/// `out[out_at + r·out_stride + t] += Σ_{j < len} a[a_at + r·a_stride + j] · x[x_at + offsets[t] + j]`,
/// each sum taken in vector lanes and then across them.
pub(crate) struct Reduce<'a> {
    pub a: &'a [f32],
    pub a_at: usize,
    pub a_stride: usize,
    pub x: &'a [f32],
    pub x_at: usize,
    pub offsets: &'a [u32],
    /// A multiple of the vector length.
    pub len: usize,
    pub out_at: usize,
    pub out_stride: usize,
}

impl Reduce<'_> {
    /// Runs the block on `isa`.
    ///
    /// # Panics
    /// As [`Block::run`].
    pub fn run(&self, isa: Isa, out: &mut [f32]) {
        let (rows, taps) = (isa.reduce_rows(), Isa::REDUCE_TAPS);
        assert!(self.offsets.len() == taps && self.len.is_multiple_of(isa.lanes()));
        assert!(
            self.a_at + (rows - 1) * self.a_stride + self.len <= self.a.len(),
            "wide reduction reads past its rows"
        );
        let reach = self.offsets.iter().max().map_or(0, |&o| o as usize) + self.len;
        assert!(
            self.x_at + reach <= self.x.len(),
            "wide reduction reads past its input"
        );
        assert!(
            self.out_at + (rows - 1) * self.out_stride + taps <= out.len(),
            "wide reduction writes past its output"
        );
        #[cfg(target_arch = "x86_64")]
        {
            let a = self.a[self.a_at..].as_ptr();
            let x = self.x[self.x_at..].as_ptr();
            let o = out[self.out_at..].as_mut_ptr();
            let (offsets, steps) = (self.offsets.as_ptr(), self.len / isa.lanes());
            let (a_stride, out_stride) = (self.a_stride, self.out_stride);
            // SAFETY: as in `Block::run`: the instruction set is there, and
            // the asserts above bound every row, input and output index.
            unsafe {
                match isa {
                    Isa::Avx512 => {
                        x86::reduce_avx512(a, a_stride, x, offsets, steps, o, out_stride)
                    }
                    Isa::Avx2 => x86::reduce_avx2(a, a_stride, x, offsets, steps, o, out_stride),
                    #[cfg(test)]
                    Isa::Emu16 => x86::reduce_emu16(a, a_stride, x, offsets, steps, o, out_stride),
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("Isa::detect finds no wide kernels on this architecture");
    }
}
