use super::*;
use crate::ops::{LayerKernel, ReluKernel};
use crate::testing::{cpu, layer_params, uniform};

/// The fused op is linear then ReLU and dropout, bit for bit, negative
/// zeros and NaN included, with dropout off and on.
#[test]
fn fused_is_linear_then_relu_and_dropout() {
    let g = LinearGeom {
        batch: 5,
        in_features: 7,
        out_features: 6,
    };
    let mut x = uniform(1, g.batch * g.in_features, -1.0, 1.0);
    x[3] = f32::NAN;
    let (params, at) = layer_params(
        2,
        (g.in_features * g.out_features, g.out_features),
        -1.0,
        1.0,
    );
    let dev = cpu();
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for dropout in [Dropout::OFF, Dropout { p: 0.5, seed: 9 }] {
        let mut want = vec![0.0; g.batch * g.out_features];
        dev.layer_fwd(&g, &x, &params, &at, &mut want).unwrap();
        dev.relu_fwd(dropout, &mut want).unwrap();
        let mut got = vec![f32::NAN; want.len()];
        dev.linear_relu_fwd(&g, dropout, &x, &params, &at, &mut got)
            .unwrap();
        assert_eq!(bits(&got), bits(&want), "{dropout:?}");
        assert!(got.iter().any(|v| v.is_nan()) && got.contains(&0.0));
        assert!(got.iter().any(|v| *v > 0.0));
    }
}

/// A drop probability outside [0, 1) is refused, as by ReLU.
#[test]
fn a_bad_drop_probability_is_an_error() {
    let g = LinearGeom {
        batch: 1,
        in_features: 1,
        out_features: 1,
    };
    let at = ParamAt {
        weight: 0..1,
        bias: 1..2,
    };
    let mut y = vec![0.0];
    let bad = Dropout { p: 1.0, seed: 0 };
    let err = cpu()
        .linear_relu_fwd(&g, bad, &vec![1.0], &vec![1.0, 0.0], &at, &mut y)
        .unwrap_err();
    assert!(err.to_string().contains("drop probability"), "{err}");
}

/// The fused backward pass is ReLU's then the layer's, bit for bit: the
/// masked gradient, dW, db and dx.
#[test]
fn fused_backward_is_relu_then_linear() {
    let g = LinearGeom {
        batch: 6,
        in_features: 5,
        out_features: 7,
    };
    let x = uniform(3, g.batch * g.in_features, -1.0, 1.0);
    let (params, at) = layer_params(
        4,
        (g.in_features * g.out_features, g.out_features),
        -1.0,
        1.0,
    );
    let dy = uniform(5, g.batch * g.out_features, -1.0, 1.0);
    let dropout = Dropout { p: 0.4, seed: 11 };
    let dev = cpu();
    let mut y = vec![0.0; dy.len()];
    dev.linear_relu_fwd(&g, dropout, &x, &params, &at, &mut y)
        .unwrap();
    let run = |fused: bool| {
        let (mut dy, mut grads, mut dx) = (dy.clone(), vec![0.0; params.len()], x.clone());
        if fused {
            let io = (&y, &mut dy);
            dev.linear_relu_bwd(&g, dropout, &x, &params, &at, io, &mut grads, Some(&mut dx))
                .unwrap();
        } else {
            dev.relu_bwd(dropout, &y, &mut dy).unwrap();
            dev.layer_bwd(&g, &x, &params, &at, &dy, &mut grads, Some(&mut dx))
                .unwrap();
        }
        [dy, grads, dx].map(|v| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>())
    };
    let fused = run(true);
    assert_eq!(fused, run(false));
    assert!(fused[0].contains(&0) && fused[0].iter().any(|&b| b != 0));
}
