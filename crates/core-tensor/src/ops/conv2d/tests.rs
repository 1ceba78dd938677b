use ndarray::{Array1, Array4};

use super::*;
use crate::Cpu;
use crate::ops::{LayerKernel, ParamAt};
use crate::testing::{assert_close, check_grad, cpu, dot, layer_params, uniform};

/// Direct six-loop convolution in f64: the definition, for comparison only.
pub(super) fn naive_conv(g: &Conv2dGeom, x: &[f32], w: &[f32], b: &[f32]) -> Vec<f32> {
    let x = Array4::from_shape_vec((g.batch, g.in_channels, g.in_h, g.in_w), x.to_vec()).unwrap();
    let w = Array4::from_shape_vec(
        (g.out_channels, g.in_channels, g.kernel, g.kernel),
        w.to_vec(),
    )
    .unwrap();
    let b = Array1::from_vec(b.to_vec());
    let mut y = Array4::<f64>::zeros((g.batch, g.out_channels, g.out_h(), g.out_w()));
    for ((n, o, oh, ow), out) in y.indexed_iter_mut() {
        let mut acc = f64::from(b[o]);
        for c in 0..g.in_channels {
            for kh in 0..g.kernel {
                for kw in 0..g.kernel {
                    let ih = (oh * g.stride + kh) as isize - g.padding as isize;
                    let iw = (ow * g.stride + kw) as isize - g.padding as isize;
                    if (0..g.in_h as isize).contains(&ih) && (0..g.in_w as isize).contains(&iw) {
                        acc += f64::from(x[[n, c, ih as usize, iw as usize]])
                            * f64::from(w[[o, c, kh, kw]]);
                    }
                }
            }
        }
        *out = acc;
    }
    y.iter().map(|&v| v as f32).collect()
}

fn geoms() -> [Conv2dGeom; 3] {
    let base = Conv2dGeom {
        batch: 2,
        in_channels: 3,
        in_h: 7,
        in_w: 6,
        out_channels: 4,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    [
        base,
        Conv2dGeom {
            stride: 2,
            padding: 1,
            ..base
        },
        Conv2dGeom {
            kernel: 2,
            padding: 2,
            in_w: 5,
            ..base
        },
    ]
}

struct Case {
    x: Vec<f32>,
    params: Vec<f32>,
    at: ParamAt,
}

fn case(g: &Conv2dGeom, seed: u64) -> Case {
    let (params, at) = layer_params(seed + 1, (g.weight_len(), g.out_channels), -0.5, 0.5);
    Case {
        x: uniform(seed, g.batch * g.in_image_len(), -1.0, 1.0),
        params,
        at,
    }
}

fn forward(cpu: &Cpu, g: &Conv2dGeom, x: &[f32], params: &[f32], at: &ParamAt) -> Vec<f32> {
    let mut y = vec![0.0; g.batch * g.out_image_len()];
    cpu.layer_fwd(g, &x.to_vec(), &params.to_vec(), at, &mut y)
        .unwrap();
    y
}

#[test]
fn forward_matches_the_definition() {
    for (i, g) in geoms().iter().enumerate() {
        let c = case(g, i as u64);
        let want = naive_conv(
            g,
            &c.x,
            &c.params[c.at.weight.clone()],
            &c.params[c.at.bias.clone()],
        );
        assert_close(
            &format!("{g:?}"),
            &forward(&cpu(), g, &c.x, &c.params, &c.at),
            &want,
            1e-5,
        );
    }
}

#[test]
fn backward_passes_the_finite_difference_check() {
    for (i, g) in geoms().iter().enumerate() {
        let c = case(g, 10 + i as u64);
        let r = uniform(99, g.batch * g.out_image_len(), -1.0, 1.0);
        let mut grads = vec![0.0; c.params.len()];
        let mut dx = vec![0.0; c.x.len()];
        cpu()
            .layer_bwd(g, &c.x, &c.params, &c.at, &r, &mut grads, Some(&mut dx))
            .unwrap();
        check_grad("conv dx", &c.x, &dx, |x| {
            dot(&r, &forward(&cpu(), g, x, &c.params, &c.at))
        });
        check_grad("conv dW,db", &c.params, &grads, |p| {
            dot(&r, &forward(&cpu(), g, &c.x, p, &c.at))
        });
    }
}

#[test]
fn threads_do_not_change_the_forward_bits_and_barely_the_backward() {
    let g = Conv2dGeom {
        batch: 5,
        ..geoms()[1]
    };
    let c = case(&g, 3);
    let three = Cpu::new(3).unwrap();
    assert_eq!(
        forward(&three, &g, &c.x, &c.params, &c.at),
        forward(&cpu(), &g, &c.x, &c.params, &c.at)
    );
    let dy = uniform(4, g.batch * g.out_image_len(), -1.0, 1.0);
    let run = |b: &Cpu| {
        let (mut grads, mut dx) = (vec![0.0; c.params.len()], vec![0.0; c.x.len()]);
        b.layer_bwd(&g, &c.x, &c.params, &c.at, &dy, &mut grads, Some(&mut dx))
            .unwrap();
        (grads, dx)
    };
    let ((g1, dx1), (g3, dx3)) = (run(&cpu()), run(&three));
    assert_eq!(
        dx1, dx3,
        "dx is computed per image, so it must be bit-identical"
    );
    assert_close("dW across thread counts", &g3, &g1, 1e-5);
    assert_eq!(
        run(&three),
        (g3, dx3),
        "a fixed thread count is deterministic"
    );
}

#[test]
fn skipping_dx_still_writes_weight_gradients() {
    let g = geoms()[0];
    let c = case(&g, 5);
    let dy = uniform(6, g.batch * g.out_image_len(), -1.0, 1.0);
    let (mut with, mut without, mut dx) = (
        vec![0.0; c.params.len()],
        vec![7.0; c.params.len()],
        vec![0.0; c.x.len()],
    );
    cpu()
        .layer_bwd(&g, &c.x, &c.params, &c.at, &dy, &mut with, Some(&mut dx))
        .unwrap();
    cpu()
        .layer_bwd(&g, &c.x, &c.params, &c.at, &dy, &mut without, None)
        .unwrap();
    assert_eq!(with, without);
}

#[test]
fn wrong_lengths_and_geometries_are_errors() {
    let g = geoms()[0];
    let c = case(&g, 1);
    let mut short = vec![0.0; 3];
    let err = cpu()
        .layer_fwd(&g, &c.x, &c.params, &c.at, &mut short)
        .unwrap_err();
    assert!(
        err.to_string().contains("buffer `y` has 3 elements"),
        "{err}"
    );
    let huge = Conv2dGeom { kernel: 9, ..g };
    assert!(
        huge.validate()
            .unwrap_err()
            .to_string()
            .contains("larger than the padded input")
    );
}

/// Expected values recorded from PyTorch 2.15 (CPU):
/// ```python
/// seq = lambda n, a, b: torch.tensor([math.sin(a*i+b) for i in range(n)])
/// x = seq(40, .37, .1).reshape(1,2,5,4).requires_grad_()
/// w = seq(36, .23, .5).reshape(2,2,3,3).requires_grad_(); b = seq(2, 1.1, 0.).requires_grad_()
/// y = F.conv2d(x, w, b, padding=1); r = seq(y.numel(), .71, .3).reshape(y.shape)
/// (y*r).sum().backward()   # y[:8], x.grad[:8], w.grad[:8], b.grad
/// ```
#[test]
fn matches_pytorch_reference_values() {
    use crate::testing::sine;
    let g = Conv2dGeom {
        batch: 1,
        in_channels: 2,
        in_h: 5,
        in_w: 4,
        out_channels: 2,
        kernel: 3,
        stride: 1,
        padding: 1,
    };
    let x = sine(40, 0.37, 0.1);
    let mut params = sine(36, 0.23, 0.5);
    params.extend(sine(2, 1.1, 0.0));
    let at = ParamAt {
        weight: 0..36,
        bias: 36..38,
    };
    let y = forward(&cpu(), &g, &x, &params, &at);
    let r = sine(y.len(), 0.71, 0.3);
    let (mut grads, mut dx) = (vec![0.0; 38], vec![0.0; 40]);
    cpu()
        .layer_bwd(&g, &x, &params, &at, &r, &mut grads, Some(&mut dx))
        .unwrap();
    assert_close(
        "y",
        &y[..8],
        &[
            0.766791, 2.502111, 3.869836, 3.072677, 4.13818, 6.365295, 5.808767, 3.195795,
        ],
        1e-5,
    );
    assert_close(
        "dx",
        &dx[..8],
        &[
            1.460306, 2.277737, 1.564255, 0.39144, -0.310352, -0.146538, 0.395726, 0.427507,
        ],
        1e-5,
    );
    assert_close(
        "dw",
        &grads[..8],
        &[
            0.521706, 0.698228, 0.167727, 0.2075, 0.40988, 0.012829, 0.395394, 0.942322,
        ],
        1e-5,
    );
    assert_close("db", &grads[36..], &[1.447567, 1.423617], 1e-5);
}

/// The backward pass by its definition, in f64: `(dx, dW)`.
pub(super) fn naive_conv_bwd(
    g: &Conv2dGeom,
    x: &[f32],
    w: &[f32],
    dy: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let (k, (oh_n, ow_n)) = (g.kernel, (g.out_h(), g.out_w()));
    let (mut dx, mut dw) = (vec![0.0f64; x.len()], vec![0.0f64; w.len()]);
    for n in 0..g.batch {
        for o in 0..g.out_channels {
            for (oh, ow) in (0..oh_n).flat_map(|oh| (0..ow_n).map(move |ow| (oh, ow))) {
                let d = f64::from(dy[((n * g.out_channels + o) * oh_n + oh) * ow_n + ow]);
                for (c, kh, kw) in (0..g.in_channels)
                    .flat_map(|c| (0..k).flat_map(move |kh| (0..k).map(move |kw| (c, kh, kw))))
                {
                    let ih = (oh * g.stride + kh).checked_sub(g.padding);
                    let iw = (ow * g.stride + kw).checked_sub(g.padding);
                    let (Some(ih), Some(iw)) = (ih, iw) else {
                        continue;
                    };
                    if ih >= g.in_h || iw >= g.in_w {
                        continue;
                    }
                    let xi = ((n * g.in_channels + c) * g.in_h + ih) * g.in_w + iw;
                    let wi = ((o * g.in_channels + c) * k + kh) * k + kw;
                    dx[xi] += d * f64::from(w[wi]);
                    dw[wi] += d * f64::from(x[xi]);
                }
            }
        }
    }
    let f32s = |v: Vec<f64>| v.into_iter().map(|v| v as f32).collect();
    (f32s(dx), f32s(dw))
}

/// The largest error of `got` against `want`, relative to the largest
/// magnitude in `want` (element-wise ratios would measure the cancellation
/// near zero that every summation order suffers, not the method).
pub(super) fn max_rel_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    let err = got.iter().zip(want).map(|(g, w)| (g - w).abs());
    err.fold(0.0, f32::max) / scale
}

/// On CNN_MNIST's conv2 shape (32→64, 3×3 over 26×26), and on a padded,
/// odd-sized one, y, dx and dW stay within 1e-5 of the f64 definition,
/// relative to the largest magnitude (the measured maxima are in
/// docs/benchmarks.md; print them with `--nocapture`): the bar any faster
/// kernel (Winograd, say) must clear.
#[test]
fn conv2s_shape_matches_the_definition_in_every_gradient() {
    let conv2 = Conv2dGeom {
        batch: 2,
        in_channels: 32,
        in_h: 26,
        in_w: 26,
        out_channels: 64,
        kernel: 3,
        stride: 1,
        padding: 0,
    };
    let odd = Conv2dGeom {
        batch: 3,
        in_channels: 5,
        in_h: 9,
        in_w: 6,
        out_channels: 3,
        padding: 1,
        ..conv2
    };
    for g in [conv2, odd] {
        let c = case(&g, 21);
        let (w, b) = (&c.params[c.at.weight.clone()], &c.params[c.at.bias.clone()]);
        let y = forward(&cpu(), &g, &c.x, &c.params, &c.at);
        let dy = uniform(22, y.len(), -1.0, 1.0);
        let (mut grads, mut dx) = (vec![0.0; c.params.len()], vec![0.0; c.x.len()]);
        cpu()
            .layer_bwd(&g, &c.x, &c.params, &c.at, &dy, &mut grads, Some(&mut dx))
            .unwrap();
        let (want_dx, want_dw) = naive_conv_bwd(&g, &c.x, w, &dy);
        let errors = [
            ("y", max_rel_error(&y, &naive_conv(&g, &c.x, w, b))),
            ("dx", max_rel_error(&dx, &want_dx)),
            ("dW", max_rel_error(&grads[c.at.weight.clone()], &want_dw)),
        ];
        println!("max relative error, {g:?}: {errors:?}");
        for (what, err) in errors {
            assert!(err <= 1e-5, "{what}: max relative error {err}");
        }
    }
}
