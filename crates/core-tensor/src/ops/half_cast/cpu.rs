//! The reference casts; `half_cast.cu` mirrors each function line for line.

use std::ops::Range;

use super::{Half, HalfCastKernel, check};
use crate::{Cpu, Result};

/// Rounds to bfloat16: the top half of the bits, plus the rounding
/// bias (nearest, ties to even); a NaN keeps its top bits, made quiet.
#[inline]
fn to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x40) as u16;
    }
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// Rounds to binary16, nearest with ties to even (F. Giesen's
/// `float_to_half_fast3_rtne`): a subnormal result through one exactly
/// rounded float addition, a normal one by rebiasing the exponent and
/// adding the rounding bias; overflow goes to infinity, NaN to 0x7e00.
#[inline]
fn to_fp16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let abs = bits & 0x7fff_ffff;
    let magnitude = if abs >= 0x4780_0000 {
        // At least 2^16 (or infinity, or NaN).
        if abs > 0x7f80_0000 { 0x7e00 } else { 0x7c00 }
    } else if abs < 0x3880_0000 {
        // Below 2^-14: a subnormal (or zero) binary16; adding 0.5 puts its
        // 10 bits, rounded, at the bottom of the float's.
        (f32::from_bits(abs) + 0.5)
            .to_bits()
            .wrapping_sub(0x3f00_0000)
    } else {
        let odd = (abs >> 13) & 1;
        // Exponent rebiased from 127 to 15, plus the bias of the rounding.
        (abs.wrapping_add(0xc800_0fff).wrapping_add(odd)) >> 13
    };
    sign | magnitude as u16
}

#[inline]
fn from_bf16(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// Exact: every binary16 is a float32.
#[inline]
fn from_fp16(h: u16) -> f32 {
    let sign = u32::from(h & 0x8000) << 16;
    let exp = u32::from(h >> 10) & 0x1f;
    let mant = u32::from(h) & 0x3ff;
    let magnitude = match exp {
        // mant · 2^-24, exact in f32.
        0 => (mant as f32 * (1.0 / 16_777_216.0)).to_bits(),
        0x1f => 0x7f80_0000 | (mant << 13),
        _ => ((exp + 112) << 23) | (mant << 13),
    };
    f32::from_bits(sign | magnitude)
}

impl HalfCastKernel for Cpu {
    fn to_half(
        &self,
        format: Half,
        src: &Vec<f32>,
        dst: &mut Vec<u16>,
        range: Range<usize>,
    ) -> Result<()> {
        check(src.len(), dst.len(), &range)?;
        let cast = match format {
            Half::Bf16 => to_bf16,
            Half::Fp16 => to_fp16,
        };
        for (d, &s) in dst[range.clone()].iter_mut().zip(&src[range]) {
            *d = cast(s);
        }
        Ok(())
    }

    fn widen_half(
        &self,
        format: Half,
        src: &Vec<u16>,
        dst: &mut Vec<f32>,
        range: Range<usize>,
    ) -> Result<()> {
        check(dst.len(), src.len(), &range)?;
        let cast = match format {
            Half::Bf16 => from_bf16,
            Half::Fp16 => from_fp16,
        };
        for (d, &s) in dst[range.clone()].iter_mut().zip(&src[range]) {
            *d = cast(s);
        }
        Ok(())
    }
}
