use super::*;
use crate::ops::ReluKernel;
use crate::testing::{check_grad, cpu, dot, uniform};

const G: PoolGeom = PoolGeom {
    batch: 2,
    channels: 3,
    in_h: 5,
    in_w: 4,
};

#[test]
fn forward_takes_window_maxima_and_drops_the_odd_row() {
    let g = PoolGeom {
        batch: 1,
        channels: 1,
        in_h: 3,
        in_w: 4,
    };
    #[rustfmt::skip]
    let x = vec![
        1.0, 2.0, 0.0, -1.0,
        4.0, 3.0, -5.0, -2.0,
        9.0, 9.0, 9.0, 9.0,
    ];
    let mut y = vec![0.0; 2];
    cpu()
        .maxpool2d_fwd(&g, Epilogue::Identity, &x, &mut y)
        .unwrap();
    assert_eq!(y, vec![4.0, 0.0]);
}

#[test]
fn backward_routes_to_the_first_maximum_or_nan() {
    let g = PoolGeom {
        batch: 1,
        channels: 2,
        in_h: 2,
        in_w: 2,
    };
    let x = vec![
        3.0,
        3.0,
        1.0,
        3.0,
        /* second plane */ 1.0,
        f32::NAN,
        2.0,
        7.0,
    ];
    let (mut dx, dy) = (vec![0.0; 8], vec![10.0, 20.0]);
    cpu()
        .maxpool2d_bwd(&g, Epilogue::Identity, &x, &dy, &dy, &mut dx)
        .unwrap();
    assert_eq!(dx, vec![10.0, 0.0, 0.0, 0.0, 0.0, 20.0, 0.0, 0.0]);
}

#[test]
fn backward_picks_a_nan_after_the_maximum_and_the_first_of_equal_maxima() {
    let g = PoolGeom {
        batch: 1,
        channels: 3,
        in_h: 2,
        in_w: 2,
    };
    #[rustfmt::skip]
    let x = vec![
        7.0, 1.0, f32::NAN, f32::NAN, // the first NaN wins over 7
        -1.0, 5.0, 2.0, 5.0,          // the first 5
        0.0, -0.0, -3.0, 0.0,         // 0 == -0: the first
    ];
    let (mut dx, dy) = (vec![9.0; 12], vec![1.0, 2.0, 3.0]);
    cpu()
        .maxpool2d_bwd(&g, Epilogue::Identity, &x, &dy, &dy, &mut dx)
        .unwrap();
    #[rustfmt::skip]
    let want = vec![
        0.0, 0.0, 1.0, 0.0,
        0.0, 2.0, 0.0, 0.0,
        3.0, 0.0, 0.0, 0.0,
    ];
    assert_eq!(dx, want);
}

#[test]
fn backward_passes_the_finite_difference_check() {
    // Distinct values spaced wider than the probe step keep every argmax stable.
    let mut x: Vec<f32> = (0..G.input_len())
        .map(|i| (i * 37 % 120) as f32 * 0.05)
        .collect();
    x.iter_mut()
        .zip(uniform(3, G.input_len(), 0.0, 0.001))
        .for_each(|(v, n)| *v += n);
    let r = uniform(4, G.output_len(), -1.0, 1.0);
    let mut dx = vec![0.0; x.len()];
    cpu()
        .maxpool2d_bwd(&G, Epilogue::Identity, &x, &r, &r, &mut dx)
        .unwrap();
    check_grad("maxpool", &x, &dx, |x| {
        let mut y = vec![0.0; G.output_len()];
        cpu()
            .maxpool2d_fwd(&G, Epilogue::Identity, &x.to_vec(), &mut y)
            .unwrap();
        dot(&r, &y)
    });
}

#[test]
fn wrong_lengths_are_errors() {
    let err = cpu()
        .maxpool2d_fwd(
            &G,
            Epilogue::Identity,
            &vec![0.0; 3],
            &mut vec![0.0; G.output_len()],
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("buffer `x` has 3 elements"),
        "{err}"
    );
}

#[test]
fn planes_without_a_window_are_errors() {
    for (in_h, in_w) in [(1, 4), (4, 1), (0, 0)] {
        let g = PoolGeom {
            batch: 1,
            channels: 1,
            in_h,
            in_w,
        };
        let x = vec![0.0; in_h * in_w];
        let then = Epilogue::Identity;
        let err = cpu().maxpool2d_fwd(&g, then, &x, &mut vec![]).unwrap_err();
        assert!(err.to_string().contains("no 2x2 window"), "{err}");
        let err = cpu()
            .maxpool2d_bwd(&g, then, &x, &vec![], &vec![], &mut x.clone())
            .unwrap_err();
        assert!(err.to_string().contains("no 2x2 window"), "{err}");
    }
}

/// `(y, dx)` of one forward and backward pass through `then`.
fn pool(b: &crate::Cpu, then: Epilogue, x: &[f32], dy: &[f32]) -> (Vec<f32>, Vec<f32>) {
    let x = x.to_vec();
    let (mut y, mut dx) = (vec![0.0; dy.len()], vec![7.0; x.len()]);
    b.maxpool2d_fwd(&G, then, &x, &mut y).unwrap();
    b.maxpool2d_bwd(&G, then, &x, &y, &dy.to_vec(), &mut dx)
        .unwrap();
    (y, dx)
}

/// Planes are split between threads (here 6 planes over 4 threads: three
/// groups of 2), which must not change a bit, odd trailing row included,
/// nor the dropout's element indices.
#[test]
fn threads_do_not_change_the_bits() {
    let x = uniform(5, G.input_len(), -1.0, 1.0);
    let dy = uniform(6, G.output_len(), -1.0, 1.0);
    let four = crate::Cpu::new(4).unwrap();
    let dropout = Dropout { p: 0.5, seed: 9 };
    for then in [Epilogue::Identity, Epilogue::ReluDropout(dropout)] {
        assert_eq!(pool(&four, then, &x, &dy), pool(&cpu(), then, &x, &dy));
    }
}

/// The epilogue gives the bits of the pool followed by the ReLU kernel
/// (with its dropout), forward and backward: the fusion changes no value.
#[test]
fn the_epilogue_is_the_relu_kernel_after_the_pool() {
    let mut x = uniform(7, G.input_len(), -1.0, 1.0);
    x[9] = f32::NAN;
    let dy = uniform(8, G.output_len(), -1.0, 1.0);
    let four = crate::Cpu::new(4).unwrap();
    for dropout in [Dropout::OFF, Dropout { p: 0.25, seed: 3 }] {
        let (mut want_y, _) = pool(&four, Epilogue::Identity, &x, &dy);
        four.relu_fwd(dropout, &mut want_y).unwrap();
        let mut masked = dy.clone();
        four.relu_bwd(dropout, &want_y, &mut masked).unwrap();
        let (_, want_dx) = pool(&four, Epilogue::Identity, &x, &masked);
        let (y, dx) = pool(&four, Epilogue::ReluDropout(dropout), &x, &dy);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&y), bits(&want_y), "{dropout:?}: y");
        assert_eq!(bits(&dx), bits(&want_dx), "{dropout:?}: dx");
    }
}

#[test]
fn a_drop_probability_outside_zero_to_one_is_an_error() {
    let x = vec![0.0; G.input_len()];
    let then = Epilogue::ReluDropout(Dropout { p: 1.0, seed: 0 });
    let mut y = vec![0.0; G.output_len()];
    let err = cpu().maxpool2d_fwd(&G, then, &x, &mut y).unwrap_err();
    assert!(err.to_string().contains("outside [0, 1)"), "{err}");
}
