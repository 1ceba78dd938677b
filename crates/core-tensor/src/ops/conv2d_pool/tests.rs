use super::*;
use crate::Cpu;
use crate::ops::{Dropout, LayerKernel, MaxPool2dKernel};
use crate::testing::{cpu, layer_params, uniform};

/// Odd output planes (7 x 5: a dropped row and column) and CNN_MNIST's
/// conv2 at a small batch.
fn geoms() -> [Conv2dGeom; 2] {
    [
        Conv2dGeom {
            batch: 3,
            in_channels: 2,
            in_h: 9,
            in_w: 7,
            out_channels: 5,
            kernel: 3,
            stride: 1,
            padding: 0,
        },
        Conv2dGeom {
            batch: 2,
            in_channels: 32,
            in_h: 26,
            in_w: 26,
            out_channels: 64,
            kernel: 3,
            stride: 1,
            padding: 0,
        },
    ]
}

fn params(g: &Conv2dGeom, seed: u64) -> (Vec<f32>, ParamAt) {
    layer_params(seed, (g.weight_len(), g.out_channels), -0.5, 0.5)
}

const THEN: Epilogue = Epilogue::ReluDropout(Dropout { p: 0.25, seed: 9 });

/// The fused op's outputs and gradients are the unfused ops' bits, and the
/// argmax bytes name a maximum of each window.
#[test]
fn fused_is_the_unfused_ops_bit_for_bit() {
    let dev = cpu();
    for g in geoms() {
        let pool = pool_of(&g);
        let x = uniform(1, g.batch * g.in_image_len(), -1.0, 1.0);
        let (p, at) = params(&g, 2);
        let dy = uniform(3, pool.output_len(), -1.0, 1.0);

        let mut a = vec![0.0; pool.input_len()];
        dev.layer_fwd(&g, &x, &p, &at, &mut a).unwrap();
        let mut y = vec![0.0; pool.output_len()];
        dev.maxpool2d_fwd(&pool, THEN, &a, &mut y).unwrap();
        let mut da = vec![f32::NAN; a.len()];
        dev.maxpool2d_bwd(&pool, THEN, &a, &y, &dy, &mut da)
            .unwrap();
        let (mut grads, mut dx) = (vec![0.0; p.len()], vec![0.0; x.len()]);
        dev.layer_bwd(&g, &x, &p, &at, &da, &mut grads, Some(&mut dx))
            .unwrap();

        let mut fy = vec![f32::NAN; y.len()];
        let mut arg = vec![9u8; y.len()];
        dev.conv2d_pool_fwd(&g, THEN, &x, &p, &at, &mut fy, &mut arg)
            .unwrap();
        let mut fda = vec![f32::NAN; a.len()];
        let (mut fgrads, mut fdx) = (vec![f32::NAN; p.len()], vec![f32::NAN; x.len()]);
        let saved = (&arg, &fy, &dy);
        dev.conv2d_pool_bwd(
            &g,
            THEN,
            (&x, &p, &at),
            saved,
            &mut fda,
            &mut fgrads,
            Some(&mut fdx),
        )
        .unwrap();

        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fy), bits(&y), "{g:?} y");
        assert_eq!(bits(&fda), bits(&da), "{g:?} da");
        assert_eq!(bits(&fgrads), bits(&grads), "{g:?} grads");
        assert_eq!(bits(&fdx), bits(&dx), "{g:?} dx");
        let mut plain = vec![0.0; y.len()];
        dev.maxpool2d_fwd(&pool, Epilogue::Identity, &a, &mut plain)
            .unwrap();
        for (i, (&k, &m)) in arg.iter().zip(&plain).enumerate() {
            let places = cpu::window_places(&pool, i);
            assert!(k < 4 && a[places[usize::from(k)]] == m, "{g:?} window {i}");
        }
    }
}

/// Ties go to the first maximum, a NaN wins, the first NaN of two.
#[test]
fn argmax_takes_the_first_maximum_or_nan() {
    let g = Conv2dGeom {
        batch: 1,
        in_channels: 1,
        in_h: 2,
        in_w: 8,
        out_channels: 1,
        kernel: 1,
        stride: 1,
        padding: 0,
    };
    // A 1x1 kernel of weight 1 and bias 0 copies x.
    let (p, at) = (
        vec![1.0, 0.0],
        ParamAt {
            weight: 0..1,
            bias: 1..2,
        },
    );
    let nan = f32::NAN;
    #[rustfmt::skip]
    let x = vec![
        1.0, 3.0,   5.0, 5.0,   nan, 2.0,   0.0, nan,
        3.0, 2.0,   5.0, 1.0,   9.0, nan,   nan, 1.0,
    ];
    let (mut y, mut arg) = (vec![0.0; 4], vec![0u8; 4]);
    cpu()
        .conv2d_pool_fwd(&g, Epilogue::Identity, &x, &p, &at, &mut y, &mut arg)
        .unwrap();
    assert_eq!(arg, vec![1, 0, 0, 1]);
    assert_eq!(&y[..2], &[3.0, 5.0]);
    assert!(y[2].is_nan() && y[3].is_nan());
}

#[test]
fn wrong_lengths_and_windowless_planes_are_refused() {
    let dev: Cpu = cpu();
    let g = geoms()[0];
    let pool = pool_of(&g);
    let x = vec![0.0; g.batch * g.in_image_len()];
    let (p, at) = params(&g, 1);
    let mut y = vec![0.0; pool.output_len()];
    let mut short = vec![0u8; pool.output_len() - 1];
    let err = dev
        .conv2d_pool_fwd(&g, THEN, &x, &p, &at, &mut y, &mut short)
        .unwrap_err();
    assert!(err.to_string().contains("argmax"), "{err}");
    let flat = Conv2dGeom { in_h: 3, ..g };
    let err = dev
        .conv2d_pool_fwd(&flat, THEN, &x, &p, &at, &mut y, &mut vec![0u8; 0])
        .unwrap_err();
    assert!(err.to_string().contains("no 2x2 window"), "{err}");
}
