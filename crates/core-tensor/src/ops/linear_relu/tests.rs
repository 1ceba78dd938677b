use crate::ops::{Dropout, LayerKernel, LinearGeom, ParamAt};
use crate::testing::cpu;

/// A drop probability outside `[0, 1)` is refused, naming it.
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
        .layer_relu_fwd(&g, bad, &vec![1.0], &vec![1.0, 0.0], &at, &mut y)
        .unwrap_err();
    assert!(err.to_string().contains("drop probability"), "{err}");
}
