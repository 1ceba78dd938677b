use super::*;
use crate::ops::{Dropout, LayerKernel, ReluKernel};
use crate::testing::{cpu, layer_params, uniform};

/// The fused op is conv2d then ReLU, bit for bit, negative zeros and NaN
/// included.
#[test]
fn fused_is_conv_then_relu() {
    let g = Conv2dGeom {
        batch: 2,
        in_channels: 1,
        in_h: 9,
        in_w: 8,
        out_channels: 4,
        kernel: 3,
        stride: 1,
        padding: 1,
    };
    let mut x = uniform(1, g.batch * g.in_image_len(), -1.0, 1.0);
    x[5] = f32::NAN;
    let (params, at) = layer_params(2, (g.weight_len(), g.out_channels), -1.0, 1.0);
    let dev = cpu();
    let mut want = vec![0.0; g.batch * g.out_image_len()];
    dev.layer_fwd(&g, &x, &params, &at, &mut want).unwrap();
    dev.relu_fwd(Dropout::OFF, &mut want).unwrap();
    let mut got = vec![f32::NAN; want.len()];
    dev.conv2d_relu_fwd(&g, &x, &params, &at, &mut got).unwrap();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&got), bits(&want));
    assert!(got.iter().any(|v| v.is_nan()) && got.contains(&0.0));
}
