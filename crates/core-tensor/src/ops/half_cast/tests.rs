use super::*;
use crate::testing::cpu;

/// Every 16-bit pattern decodes as the `half` crate decodes it (NaNs:
/// as NaNs), and rounds back to itself.
#[test]
fn every_16_bit_value_decodes_exactly_and_rounds_back() {
    let cpu = cpu();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    for format in [Half::Bf16, Half::Fp16] {
        let mut floats = vec![0.0f32; all.len()];
        cpu.widen_half(format, &all, &mut floats, 0..all.len())
            .unwrap();
        let mut back = vec![0u16; all.len()];
        cpu.to_half(format, &floats, &mut back, 0..all.len())
            .unwrap();
        for ((&h, &f), &b) in all.iter().zip(&floats).zip(&back) {
            let want = match format {
                Half::Bf16 => half::bf16::from_bits(h).to_f32(),
                Half::Fp16 => half::f16::from_bits(h).to_f32(),
            };
            if want.is_nan() {
                assert!(f.is_nan(), "{format:?} {h:#06x}");
                continue;
            }
            assert_eq!(f.to_bits(), want.to_bits(), "{format:?} {h:#06x}");
            assert_eq!(b, h, "{format:?} {h:#06x} does not round back");
        }
    }
}

/// Rounding agrees with the `half` crate's (nearest, ties to even) on
/// ties, subnormals, overflow and a sweep of float32 bit patterns.
#[test]
fn rounding_is_to_nearest_even_as_the_half_crate_rounds() {
    let cpu = cpu();
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        1.0 + 2f32.powi(-11),
        65504.0,
        65519.0,
        65520.0,
        1e9,
        f32::INFINITY,
        f32::NEG_INFINITY,
        6e-8,
        2.9e-8,
        3.0e-8,
        -5.9604645e-8,
        f32::MIN_POSITIVE,
        6.1035156e-5,
        6.1e-5,
    ];
    xs.extend((0..200_000u32).map(|i| f32::from_bits(i.wrapping_mul(0x9E37_79B9))));
    xs.retain(|x| !x.is_nan());
    for format in [Half::Bf16, Half::Fp16] {
        let mut got = vec![0u16; xs.len()];
        cpu.to_half(format, &xs, &mut got, 0..xs.len()).unwrap();
        for (&x, &g) in xs.iter().zip(&got) {
            let want = match format {
                Half::Bf16 => half::bf16::from_f32(x).to_bits(),
                Half::Fp16 => half::f16::from_f32(x).to_bits(),
            };
            assert_eq!(g, want, "{format:?} of {x:e} ({:#010x})", x.to_bits());
        }
    }
    let mut nan = vec![0u16; 1];
    cpu.to_half(Half::Fp16, &vec![f32::NAN], &mut nan, 0..1)
        .unwrap();
    assert_eq!(nan, [0x7e00]);
}

#[test]
fn only_the_range_is_cast_and_bad_ranges_are_errors() {
    let cpu = cpu();
    let src = vec![1.0f32, 2.0, 3.0];
    let mut dst = vec![7u16; 3];
    cpu.to_half(Half::Bf16, &src, &mut dst, 1..2).unwrap();
    assert_eq!(dst, [7, 0x4000, 7]);
    assert!(cpu.to_half(Half::Bf16, &src, &mut dst, 2..4).is_err());
    assert!(
        cpu.to_half(Half::Bf16, &src, &mut vec![0u16; 2], 0..1)
            .is_err()
    );
}
