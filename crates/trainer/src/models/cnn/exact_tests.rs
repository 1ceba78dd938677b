//! `--reproducible`'s exact sum (`crate::train::exact`) on the CNN's real
//! gradients.

use core_tensor::{Backend, Cpu, Reductions};

use super::{CnnMnist, cnn_layout};
use crate::model::{DropoutRates, DropoutSeed, Mode, Model, NoSync};
use crate::train::exact::{ExactRequest, ExactSum, UnitPlan};

/// The CNN's gradients of `units` units of 16 samples each (random images
/// and labels from `seed`), with dropout keyed by the unit's rows.
fn cnn_units(units: usize, seed: u64) -> Vec<Vec<f32>> {
    let b = Cpu::new(1).unwrap().with_reductions(Reductions::Fixed);
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let params = b.upload(&model.init_params(seed)).unwrap();
    let mut grads = b.zeros(cnn_layout().len()).unwrap();
    let mut loss = b.zeros(1).unwrap();
    let mut buf = Model::<Cpu>::buffers(&model, &b, 16, true).unwrap();
    (0..units)
        .map(|u| {
            let mix = |i: usize| core_tensor::rng::uniform(seed + u as u64, i as u64);
            let pixels: Vec<f32> = (0..16 * 784).map(mix).collect();
            let labels: Vec<u8> = (0..16).map(|i| (mix(100_000 + i) * 10.0) as u8).collect();
            b.write_range(&pixels, &mut buf.cuts[0], 0).unwrap();
            b.write_range(&labels, &mut buf.labels, 0).unwrap();
            let dropout_seed = DropoutSeed {
                seed,
                first_row: (u * 16) as u64,
            };
            model
                .forward(&b, &mut buf, &params, Mode::Train { dropout_seed })
                .unwrap();
            model.loss(&b, &mut buf, &mut loss).unwrap();
            model
                .backward(&b, &mut buf, &params, &mut grads, dropout_seed, &mut NoSync)
                .unwrap();
            b.download(&grads).unwrap()
        })
        .collect()
}

fn sum() -> ExactSum {
    let request = ExactRequest {
        global_batch: Some(128),
        unit: 16,
    };
    ExactSum::new(cnn_layout(), UnitPlan::new(request, 64, (0, 1)).unwrap())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The units' mean is the same bits whatever order the units come in (the
/// ranks' part is an integer sum too: `comm`'s tests).
#[test]
fn the_mean_ignores_the_order_of_the_units() {
    let units = cnn_units(8, 3);
    let mean = sum().mean_of(&units);
    let mut turned = units.clone();
    turned.reverse();
    turned.swap(1, 5);
    assert_eq!(bits(&mean), bits(&sum().mean_of(&turned)));
}

/// On real gradients (the CNN's, 8 units) the exact mean is at least as
/// close to the float64 mean as a float32 sum in order, divided by 8: the
/// largest error and the error's norm.
#[test]
fn the_exact_mean_is_at_least_as_accurate_as_a_float32_sum() {
    let units = cnn_units(8, 5);
    let n = units[0].len();
    let exact = sum().mean_of(&units);
    let float32: Vec<f32> = (0..n)
        .map(|i| units.iter().fold(0.0f32, |acc, u| acc + u[i]) / 8.0)
        .collect();
    let reference: Vec<f64> = (0..n)
        .map(|i| units.iter().map(|u| f64::from(u[i])).sum::<f64>() / 8.0)
        .collect();
    let errors = |got: &[f32]| {
        let diffs = got
            .iter()
            .zip(&reference)
            .map(|(&g, &r)| (f64::from(g) - r).abs());
        diffs.fold((0.0f64, 0.0f64), |(max, sq), d| (max.max(d), sq + d * d))
    };
    let ((exact_max, exact_sq), (f32_max, f32_sq)) = (errors(&exact), errors(&float32));
    assert!(
        exact_max <= f32_max,
        "largest error {exact_max:e} against float32's {f32_max:e}"
    );
    assert!(
        exact_sq <= f32_sq,
        "squared error {exact_sq:e} against float32's {f32_sq:e}"
    );
    assert!(
        f32_max > 0.0,
        "the float32 sum must round somewhere for this to test anything"
    );
}

/// A NaN or an infinity in one unit makes its block NaN (the guard's cue),
/// and leaves the other blocks alone.
#[test]
fn a_non_finite_value_spoils_its_block_alone() {
    let mut units = cnn_units(2, 7);
    let sum = sum();
    let blocks = sum.blocks();
    let clean = sum.mean_of(&units);
    units[1][5] = f32::INFINITY;
    let spoilt = sum.mean_of(&units);
    assert!(spoilt[blocks[0].clone()].iter().all(|v| v.is_nan()));
    let rest = blocks[1].start..;
    assert_eq!(bits(&spoilt[rest.clone()]), bits(&clean[rest]));
}
