use super::*;
use crate::Cpu;
use crate::ops::{LayerKernel, ParamAt};
use crate::testing::{assert_close, check_grad, cpu, dot, uniform};

const G: LinearGeom = LinearGeom {
    batch: 3,
    in_features: 5,
    out_features: 4,
};
const AT: std::ops::Range<usize> = 0..20;

fn at() -> ParamAt {
    ParamAt {
        weight: AT,
        bias: 20..24,
    }
}

fn forward(b: &Cpu, x: &[f32], params: &[f32]) -> Vec<f32> {
    let mut y = vec![0.0; G.batch * G.out_features];
    b.layer_fwd(&G, &x.to_vec(), &params.to_vec(), &at(), &mut y)
        .unwrap();
    y
}

#[test]
fn forward_is_x_times_w_transposed_plus_b() {
    let g = LinearGeom {
        batch: 2,
        in_features: 3,
        out_features: 2,
    };
    // W = [[1, 0, -1], [2, 1, 0]], b = [0.5, -1]
    let params = vec![1.0, 0.0, -1.0, 2.0, 1.0, 0.0, 0.5, -1.0];
    let x = vec![1.0, 2.0, 3.0, -1.0, 0.0, 1.0];
    let mut y = vec![0.0; 4];
    let at = ParamAt {
        weight: 0..6,
        bias: 6..8,
    };
    cpu().layer_fwd(&g, &x, &params, &at, &mut y).unwrap();
    assert_eq!(
        y,
        vec![
            1.0 - 3.0 + 0.5,
            2.0 + 2.0 - 1.0,
            -1.0 - 1.0 + 0.5,
            -2.0 - 1.0
        ]
    );
}

#[test]
fn backward_passes_the_finite_difference_check() {
    let x = uniform(1, 15, -1.0, 1.0);
    let params = uniform(2, 24, -1.0, 1.0);
    let r = uniform(3, 12, -1.0, 1.0);
    let (mut grads, mut dx) = (vec![0.0; 24], vec![0.0; 15]);
    cpu()
        .layer_bwd(&G, &x, &params, &at(), &r, &mut grads, Some(&mut dx))
        .unwrap();
    check_grad("linear dx", &x, &dx, |x| {
        dot(&r, &forward(&cpu(), x, &params))
    });
    check_grad("linear dW,db", &params, &grads, |p| {
        dot(&r, &forward(&cpu(), &x, p))
    });
}

#[test]
fn threads_agree_with_one_thread() {
    let x = uniform(4, 15, -1.0, 1.0);
    let params = uniform(5, 24, -1.0, 1.0);
    assert_close(
        "linear fwd",
        &forward(&Cpu::new(2).unwrap(), &x, &params),
        &forward(&cpu(), &x, &params),
        1e-6,
    );
}
