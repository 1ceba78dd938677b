use super::*;
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
    cpu().maxpool2d_fwd(&g, &x, &mut y).unwrap();
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
    let mut dx = vec![0.0; 8];
    cpu()
        .maxpool2d_bwd(&g, &x, &vec![10.0, 20.0], &mut dx)
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
    let mut dx = vec![9.0; 12];
    cpu()
        .maxpool2d_bwd(&g, &x, &vec![1.0, 2.0, 3.0], &mut dx)
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
    cpu().maxpool2d_bwd(&G, &x, &r, &mut dx).unwrap();
    check_grad("maxpool", &x, &dx, |x| {
        let mut y = vec![0.0; G.output_len()];
        cpu().maxpool2d_fwd(&G, &x.to_vec(), &mut y).unwrap();
        dot(&r, &y)
    });
}

#[test]
fn wrong_lengths_are_errors() {
    let err = cpu()
        .maxpool2d_fwd(&G, &vec![0.0; 3], &mut vec![0.0; G.output_len()])
        .unwrap_err();
    assert!(
        err.to_string().contains("buffer `x` has 3 elements"),
        "{err}"
    );
}

/// Planes are split between threads (here 6 planes over 4 threads: three
/// groups of 2), which must not change a bit, odd trailing row included.
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
        let err = cpu().maxpool2d_fwd(&g, &x, &mut vec![]).unwrap_err();
        assert!(err.to_string().contains("no 2x2 window"), "{err}");
        let err = cpu()
            .maxpool2d_bwd(&g, &x, &vec![], &mut x.clone())
            .unwrap_err();
        assert!(err.to_string().contains("no 2x2 window"), "{err}");
    }
}

#[test]
fn threads_do_not_change_the_bits() {
    let x = uniform(5, G.input_len(), -1.0, 1.0);
    let dy = uniform(6, G.output_len(), -1.0, 1.0);
    let run = |b: &crate::Cpu| {
        let (mut y, mut dx) = (vec![0.0; G.output_len()], vec![7.0; x.len()]);
        b.maxpool2d_fwd(&G, &x, &mut y).unwrap();
        b.maxpool2d_bwd(&G, &x, &dy, &mut dx).unwrap();
        (y, dx)
    };
    let four = crate::Cpu::new(4).unwrap();
    assert_eq!(run(&four), run(&cpu()));
}
