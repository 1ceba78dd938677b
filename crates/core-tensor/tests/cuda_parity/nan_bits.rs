//! What a GPU makes of a NaN, which the suite's comparisons leave open
//! (`support::nan_rule`): its float32 arithmetic yields one NaN,
//! 0x7fffffff, whatever NaN went in, and a copy keeps a NaN's bits. On a
//! GPU this pins the hardware's behaviour the NaN rule was written for; on
//! cuda-emu, the emulator's model of it (`emu_kernel.h`'s `gpu_result`).

use core_tensor::Backend;
use core_tensor::ops::{Dropout, LayerKernel, LinearGeom, ParamAt, ReluKernel};

use crate::support::{down, gpu, up};

/// CUDA's NaN.
const CUDA_NAN: f32 = f32::from_bits(0x7fff_ffff);
/// A quiet NaN that no arithmetic makes, on either device: only a copy
/// passes it on.
const PAYLOAD: f32 = f32::from_bits(0x7fc0_1234);

/// The bits of `v` in hex, for messages that show them.
fn bits(v: &[f32]) -> Vec<String> {
    v.iter().map(|x| format!("{:#010x}", x.to_bits())).collect()
}

#[test]
fn cuda_arithmetic_makes_one_nan() {
    let Some(gpu) = gpu("cuda_arithmetic_makes_one_nan") else {
        return;
    };
    let x = vec![PAYLOAD; 64];
    // ReLU copies a NaN; its dropout multiplies the kept ones by 2.
    let mut copied = up(&gpu, &x);
    gpu.relu_fwd(Dropout::OFF, &mut copied).unwrap();
    assert_eq!(bits(&down(&gpu, &copied)), bits(&x), "relu");
    let dropout = Dropout { p: 0.5, seed: 7 };
    let kept: Vec<bool> = (0..64).map(|i| dropout.keeps(i)).collect();
    assert!(kept.contains(&true) && kept.contains(&false), "{kept:?}");
    let mut scaled = up(&gpu, &x);
    gpu.relu_fwd(dropout, &mut scaled).unwrap();
    let want: Vec<f32> = kept
        .iter()
        .map(|&k| if k { CUDA_NAN } else { 0.0 })
        .collect();
    assert_eq!(bits(&down(&gpu, &scaled)), bits(&want), "relu, {dropout:?}");
    // The GEMM's fused multiply-adds: a NaN in row 0 of x makes row 0 of y.
    let g = LinearGeom {
        batch: 2,
        in_features: 3,
        out_features: 2,
    };
    let x = [PAYLOAD, 1.0, 2.0, 3.0, 4.0, 5.0];
    let at = ParamAt {
        weight: 0..6,
        bias: 6..8,
    };
    let mut y = gpu.zeros(4).unwrap();
    gpu.layer_fwd(&g, &up(&gpu, &x), &up(&gpu, &[0.5; 8]), &at, &mut y)
        .unwrap();
    // Row 1: 0.5 · (3 + 4 + 5) + 0.5, exact.
    let want = [CUDA_NAN, CUDA_NAN, 6.5, 6.5];
    assert_eq!(bits(&down(&gpu, &y)), bits(&want), "linear");
}
