//! `--reproducible`'s exact sum (`crate::train::exact`) on the CNN's real
//! gradients.

use core_tensor::{Backend, Cpu, Reductions};

use super::{CnnMnist, cnn_layout};
use crate::model::{DropoutRates, DropoutSeed, Mode, Model, NoSync};
use crate::train::exact::{ExactRequest, ExactSum, UnitPlan};

/// One training pass of the CNN at `params` over a batch of `batch` random
/// images and labels (`mix(i)` gives its i-th number): the buffers it
/// leaves (each layer's output) and the gradients.
fn pass(
    b: &Cpu,
    params: &Vec<f32>,
    (batch, mix): (usize, &dyn Fn(usize) -> f32),
    dropout_seed: DropoutSeed,
) -> (crate::models::cnn::Activations<Cpu>, Vec<f32>) {
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let mut grads = b.zeros(cnn_layout().len()).unwrap();
    let mut loss = b.zeros(1).unwrap();
    let mut buf = Model::<Cpu>::buffers(&model, b, batch, true).unwrap();
    let pixels: Vec<f32> = (0..batch * 784).map(mix).collect();
    let labels: Vec<u8> = (0..batch)
        .map(|i| (mix(1 << 30 | i) * 10.0) as u8)
        .collect();
    b.write_range(&pixels, &mut buf.cuts[0], 0).unwrap();
    b.write_range(&labels, &mut buf.targets, 0).unwrap();
    let train = Mode::Train { dropout_seed };
    model.forward(b, &mut buf, params, train).unwrap();
    model.loss(b, &mut buf, &mut loss).unwrap();
    (model.backward(b, &mut buf, params, &mut grads, dropout_seed, &mut NoSync)).unwrap();
    (buf, grads)
}

/// The CNN's gradients of `units` units of 16 samples each (random images
/// and labels from `seed`), with dropout keyed by the unit's rows.
fn cnn_units(units: usize, seed: u64) -> Vec<Vec<f32>> {
    let b = Cpu::new(1).unwrap().with_reductions(Reductions::Fixed);
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let params = b.upload(&model.init_params(seed)).unwrap();
    (0..units)
        .map(|u| {
            let mix = |i: usize| core_tensor::rng::uniform(seed + u as u64, i as u64);
            let dropout_seed = DropoutSeed {
                seed,
                first_row: (u * 16) as u64,
            };
            pass(&b, &params, (16, &mix), dropout_seed).1
        })
        .collect()
}

fn sum() -> ExactSum {
    let request = ExactRequest {
        global_batch: Some(128),
        unit: 16,
    };
    let (layout, plan) = (cnn_layout(), UnitPlan::new(request, 64, (0, 1)).unwrap());
    ExactSum::new(layout, 0..layout.len(), plan, 1)
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

/// A pipeline stage's exact sum over its part of the parameters gives the
/// bits of the whole model's sum there: its tensors' blocks are the same.
#[test]
fn a_stages_part_sums_to_the_whole_models_bits() {
    let units = cnn_units(4, 11);
    let (layout, plan) = (cnn_layout(), sum().plan().clone());
    let whole = sum().mean_of(&units);
    let at = |name: &str| layout.range(name).unwrap();
    for part in [
        0..at("conv2.bias").end,
        at("fc1.weight").start..layout.len(),
    ] {
        let stage = ExactSum::new(layout, part.clone(), plan.clone(), 4);
        let own: Vec<Vec<f32>> = units.iter().map(|u| u[part.clone()].to_vec()).collect();
        assert_eq!(stage.blocks().last().unwrap().end, part.len());
        assert_eq!(bits(&stage.mean_of(&own)), bits(&whole[part]));
        // 8 units of 16, all one batch of the schedule.
        assert_eq!((stage.batches(), stage.first_row(0)), ((2, 64), 0));
    }
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

/// FNV-1a over the bits of `v`: a short name for a buffer's exact contents.
fn fnv(v: &[f32]) -> u64 {
    v.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        x.to_bits()
            .to_le_bytes()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    })
}

/// Every layer's output (the segments' cuts) and every tensor's gradient
/// for fixed inputs at batch 16 and 64, with dropout, on one thread and on
/// two with fixed reductions, hashed. The table was recorded on an AMD
/// EPYC (AVX2) on 2026-12-01; a CPU that computes any layer otherwise fails
/// here naming it (the pipeline's machine dependence was fc2's product at
/// 16 rows, which gemm summed across SIMD lanes).
#[test]
fn every_layer_gives_the_recorded_bits_at_batch_16_and_64() {
    const RECORDED: [(usize, &str, u64); 24] = [
        (16, "conv1 output", 0xa7d29d4b7df9c284),
        (16, "conv2 output", 0x0f35a30fd9a692e6),
        (16, "fc1 output", 0xd9af6f02a2f65f07),
        (16, "fc2 output", 0xf1b384ea8ef4e92d),
        (16, "conv1.weight gradient", 0x77caafa4a71d414c),
        (16, "conv1.bias gradient", 0x78ef454017dcfcc5),
        (16, "conv2.weight gradient", 0xea27f4d896e2c5b0),
        (16, "conv2.bias gradient", 0x1115332f809f7a11),
        (16, "fc1.weight gradient", 0x7a753c7f7f8b8511),
        (16, "fc1.bias gradient", 0x83fa5ae302d1ed44),
        (16, "fc2.weight gradient", 0xdf6a626e194cc0f6),
        (16, "fc2.bias gradient", 0x485170cac53295db),
        (64, "conv1 output", 0xf6dd2608b8037222),
        (64, "conv2 output", 0x0b67ed4c4411471d),
        (64, "fc1 output", 0x20644cb6cc8b0ca6),
        (64, "fc2 output", 0xb6e1c5ce5694e937),
        (64, "conv1.weight gradient", 0xde3be43355a1912e),
        (64, "conv1.bias gradient", 0x1dcc6c25ba325de7),
        (64, "conv2.weight gradient", 0x3cb57e767a664ab0),
        (64, "conv2.bias gradient", 0x18fd443b8621c6f9),
        (64, "fc1.weight gradient", 0x6c439e62136152fa),
        (64, "fc1.bias gradient", 0x5bc65f73c4e07715),
        (64, "fc2.weight gradient", 0x77dcdd2975e5b910),
        (64, "fc2.bias gradient", 0x10050ab215a11399),
    ];
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let mut got = Vec::new();
    for threads in [1, 2] {
        let mut first16: Vec<Vec<f32>> = Vec::new();
        let b = Cpu::new(threads)
            .unwrap()
            .with_reductions(Reductions::Fixed);
        let params = b.upload(&model.init_params(11)).unwrap();
        for batch in [16, 64] {
            let mix = |i: usize| core_tensor::rng::uniform(99, i as u64);
            let (buf, grads) = pass(&b, &params, (batch, &mix), DropoutSeed::new(5));
            let mut table = Vec::new();
            for (k, name) in ["conv1", "conv2", "fc1", "fc2"].iter().enumerate() {
                let out = b.download(&buf.cuts[k + 1]).unwrap();
                table.push((batch, format!("{name} output"), fnv(&out)));
                // The first 16 samples are the batch of 16's: their outputs
                // must not depend on the 48 beside them.
                match batch {
                    16 => first16.push(out),
                    _ => assert!(
                        out[..first16[k].len()] == first16[k][..],
                        "{name}: a sample's output depends on the rest of its batch"
                    ),
                }
            }
            for view in cnn_layout().views() {
                let name = format!("{} gradient", view.spec.name);
                table.push((batch, name, fnv(&grads[view.range.clone()])));
            }
            if threads == 2 {
                let alone = got.iter().filter(|(n, _, _)| *n == batch);
                assert!(
                    alone.eq(table.iter()),
                    "batch {batch}: two threads computed other bits than one"
                );
            } else {
                got.extend(table);
            }
        }
    }
    for (batch, name, hash) in &got {
        println!("({batch}, \"{name}\", {hash:#018x}),");
    }
    for (want, have) in RECORDED.iter().zip(&got) {
        assert_eq!(
            (want.0, want.1, want.2),
            (have.0, have.1.as_str(), have.2),
            "another layer's bits"
        );
    }
    assert_eq!(RECORDED.len(), got.len(), "the table records every layer");
}
