//! The element types the ring reduces, and the per-type scratch space.
//!
//! Besides f32 and f64 the ring carries 64-bit integers, summed with
//! wrapping (exact, so in any order: `Communicator::all_reduce_i64`) or
//! reduced to their maximum, and two 16-bit wire types, bfloat16
//! and IEEE binary16 (`Communicator::all_reduce_half`), for gradients cast
//! before the all-reduce. A 16-bit element is summed in f32: each hop
//! decodes the arriving partial sum and its own value, adds them in f32 and
//! rounds the sum once to 16 bits for the next hop (the part's owner
//! multiplies by `1 / world` in f32 and rounds once more), so every rank
//! decodes the same 16 bits. x86 has no 16-bit float add outside
//! AVX-512 FP16, and one rounding per hop is what NCCL's bf16 reduction
//! does too (it converts to float for each addition).

use std::ops::{Add, Mul};

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};

/// Element type tag carried in collective headers, so ranks that disagree on
/// the type are caught instead of reinterpreting each other's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtype {
    F32,
    F64,
    Bf16,
    F16,
    /// i64 summed with wrapping.
    I64Sum,
    /// i64 reduced to the largest.
    I64Max,
}

impl Dtype {
    pub(crate) fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64Sum | Dtype::I64Max => 8,
            Dtype::Bf16 | Dtype::F16 => 2,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::I64Sum => "i64 (sum)",
            Dtype::I64Max => "i64 (max)",
        }
    }

    /// The header's byte for it (the size, and 16 + the size for bf16,
    /// 32 + the size for the integers' sum, 48 + for their maximum).
    pub(crate) fn code(self) -> u8 {
        match self {
            Dtype::F32 => 4,
            Dtype::F64 => 8,
            Dtype::F16 => 2,
            Dtype::Bf16 => 18,
            Dtype::I64Sum => 40,
            Dtype::I64Max => 56,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Dtype> {
        [
            Dtype::F32,
            Dtype::F64,
            Dtype::F16,
            Dtype::Bf16,
            Dtype::I64Sum,
            Dtype::I64Max,
        ]
        .into_iter()
        .find(|d| d.code() == code)
    }
}

/// Receive buffers kept between collectives so that large all-reduces do
/// not allocate (and page-fault) a fresh segment buffer on every call.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    f32: Vec<f32>,
    f64: Vec<f64>,
    /// Either 16-bit type's segment.
    b16: Vec<u16>,
    /// Either integer type's segment.
    i64: Vec<i64>,
}

/// A plain number the ring can send as bytes, add and scale.
pub(crate) trait Element:
    Pod + Send + Sync + Add<Output = Self> + Mul<Output = Self>
{
    const DTYPE: Dtype;

    /// `1 / count`, the factor of an average (`None`: the type is only
    /// summed, never averaged).
    fn reciprocal(count: usize) -> Option<Self>;

    /// A scratch buffer of at least `len` elements.
    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self];
}

fn grown<T: Pod + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    if buf.len() < len {
        buf.resize(len, T::default());
    }
    &mut buf[..len]
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;

    fn reciprocal(count: usize) -> Option<Self> {
        Some(1.0 / count as f32)
    }

    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
        grown(&mut scratch.f32, len)
    }
}

impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;

    fn reciprocal(count: usize) -> Option<Self> {
        Some(1.0 / count as f64)
    }

    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
        grown(&mut scratch.f64, len)
    }
}

/// `half`'s `+` and `*` decode both operands to f32, compute there and
/// round the result to nearest even: the module docs' one rounding per hop.
impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;

    fn reciprocal(count: usize) -> Option<Self> {
        Some(bf16::from_f32(1.0 / count as f32))
    }

    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
        bytemuck::cast_slice_mut(grown(&mut scratch.b16, len))
    }
}

impl Element for f16 {
    const DTYPE: Dtype = Dtype::F16;

    fn reciprocal(count: usize) -> Option<Self> {
        Some(f16::from_f32(1.0 / count as f32))
    }

    fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
        bytemuck::cast_slice_mut(grown(&mut scratch.b16, len))
    }
}

/// An i64 element whose ring "addition" is `$combine`; never averaged (the
/// product exists for the ring's generic code, which scales nothing here).
macro_rules! int_element {
    ($(#[$doc:meta])* $name:ident, $dtype:expr, $combine:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
        #[repr(transparent)]
        pub(crate) struct $name(pub i64);

        impl Add for $name {
            type Output = Self;
            fn add(self, other: Self) -> Self {
                let combine: fn(i64, i64) -> i64 = $combine;
                Self(combine(self.0, other.0))
            }
        }

        impl Mul for $name {
            type Output = Self;
            fn mul(self, other: Self) -> Self {
                Self(self.0.wrapping_mul(other.0))
            }
        }

        impl Element for $name {
            const DTYPE: Dtype = $dtype;

            fn reciprocal(_: usize) -> Option<Self> {
                None
            }

            fn scratch(scratch: &mut Scratch, len: usize) -> &mut [Self] {
                bytemuck::cast_slice_mut(grown(&mut scratch.i64, len))
            }
        }
    };
}

int_element!(
    /// An i64 the ring sums with wrapping: two's complement addition is
    /// associative and commutative even where it overflows, so the sum is
    /// the same whatever the order and grouping of the ranks' terms.
    WrappingSum,
    Dtype::I64Sum,
    i64::wrapping_add
);

int_element!(
    /// An i64 the ring reduces to the largest ("adding" two keeps the larger).
    Largest,
    Dtype::I64Max,
    i64::max
);

/// A 16-bit wire element: f32 rounded to nearest even, and back exactly.
pub(crate) trait Wire16: Element {
    fn encode(x: f32) -> Self;
    fn decode(self) -> f32;
}

impl Wire16 for bf16 {
    fn encode(x: f32) -> Self {
        bf16::from_f32(x)
    }
    fn decode(self) -> f32 {
        self.to_f32()
    }
}

impl Wire16 for f16 {
    fn encode(x: f32) -> Self {
        f16::from_f32(x)
    }
    fn decode(self) -> f32 {
        self.to_f32()
    }
}

/// `buf` rounded to `T`, reduced by `reduce`, and decoded back into `buf`.
pub(crate) fn through<T: Wire16, E>(
    buf: &mut [f32],
    reduce: impl FnOnce(&mut [T]) -> Result<(), E>,
) -> Result<(), E> {
    let mut wire: Vec<T> = buf.iter().map(|&x| T::encode(x)).collect();
    reduce(&mut wire)?;
    for (x, w) in buf.iter_mut().zip(wire) {
        *x = w.decode();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_codes_round_trip_and_differ() {
        for d in [
            Dtype::F32,
            Dtype::F64,
            Dtype::Bf16,
            Dtype::F16,
            Dtype::I64Sum,
            Dtype::I64Max,
        ] {
            assert_eq!(Dtype::from_code(d.code()), Some(d));
        }
        assert_eq!(Dtype::from_code(16), None);
    }

    #[test]
    fn a_16_bit_sum_rounds_once_from_f32() {
        // 1 + 2^-8 is not a bf16 (8 bits of precision): the f32 sum rounds
        // to even, 1.0; the sum with 3·2^-8 is what rounding the f32 sum
        // once gives.
        let one = bf16::from_f32(1.0);
        let tiny = bf16::from_f32(2f32.powi(-8));
        assert_eq!((one + tiny).to_f32(), 1.0);
        let three = bf16::from_f32(3.0 * 2f32.powi(-8));
        assert_eq!((one + three), bf16::from_f32(1.0 + 3.0 * 2f32.powi(-8)));
        // fp16 overflows past 65504.
        assert!((f16::from_f32(65504.0) + f16::from_f32(32.0)).is_infinite());
        // The average's factor at 4 ranks is exact in both.
        assert_eq!(bf16::reciprocal(4).map(bf16::to_f32), Some(0.25));
        assert_eq!(f16::reciprocal(4).map(f16::to_f32), Some(0.25));
    }
}
