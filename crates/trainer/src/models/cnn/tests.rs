//! The CNN's layout, geometry and initialisation checks.

use super::*;

#[test]
fn parameters_are_named_and_shaped_like_pytorchs_state_dict() {
    let got: Vec<(String, Vec<usize>)> = cnn_layout()
        .views()
        .iter()
        .map(|v| (v.spec.name.clone(), v.spec.shape.clone()))
        .collect();
    let want = [
        ("conv1.weight", vec![32, 1, 3, 3]),
        ("conv1.bias", vec![32]),
        ("conv2.weight", vec![64, 32, 3, 3]),
        ("conv2.bias", vec![64]),
        ("fc1.weight", vec![128, 9216]),
        ("fc1.bias", vec![128]),
        ("fc2.weight", vec![10, 128]),
        ("fc2.bias", vec![10]),
    ];
    assert_eq!(got, want.map(|(n, s)| (n.to_string(), s)));
    assert_eq!(cnn_layout().len(), PARAM_COUNT);
}

#[test]
fn layer_geometries_chain() {
    assert_eq!((CONV2.in_h, CONV2.in_w), (CONV1.out_h(), CONV1.out_w()));
    assert_eq!((POOL.in_h, POOL.in_w), (CONV2.out_h(), CONV2.out_w()));
    assert_eq!(FC1.in_features, POOL.output_len());
}

#[test]
fn init_is_uniform_within_pytorchs_bounds_and_seeded() {
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let init = |seed| model.init_params(seed);
    let params = init(0);
    assert_eq!(params, init(0));
    assert_ne!(params, init(1));
    for (name, fan_in) in [
        ("conv1", 9.0f32),
        ("conv2", 288.0),
        ("fc1", 9216.0),
        ("fc2", 128.0),
    ] {
        let bound = 1.0 / fan_in.sqrt();
        for part in ["weight", "bias"] {
            let values = &params[cnn_layout().range(&format!("{name}.{part}")).unwrap()];
            let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            assert!(max <= bound, "{name}.{part}: max |w| {max}, bound {bound}");
            // Thousands of weights per layer: their largest must come close.
            if part == "weight" {
                assert!(
                    max > 0.9 * bound,
                    "{name}.weight spans only ±{max} of ±{bound}"
                );
            }
        }
    }
}

/// The initial weights are pinned: a change of generator or of the
/// float conversion changes every run's numbers, so it must be seen.
#[test]
fn init_values_are_pinned() {
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let params = model.init_params(0);
    let sum: f64 = params.iter().map(|&p| f64::from(p)).sum();
    let first: Vec<f32> = params[..3].to_vec();
    assert_eq!((first, sum), (PINNED_FIRST.to_vec(), PINNED_SUM));
}

const PINNED_FIRST: [f32; 3] = [0.103_131_41, 0.139_383_6, 0.153_246_57];
const PINNED_SUM: f64 = -1.938_792_443_700_45;

/// A stage's segments over its part alone compute what the whole model's
/// do over the whole buffer, bit for bit; a segment outside the part is
/// refused.
#[test]
fn segments_within_a_part_read_it_at_shifted_offsets() {
    use core_tensor::{Backend, Cpu};

    use crate::model::Layered;
    use crate::model::layered::Chain;
    let b = Cpu::new(1).unwrap();
    let model = CnnMnist::new(DropoutRates::REFERENCE);
    let params = model.init_params(3);
    let cut = cnn_layout().range("fc1.weight").unwrap().start;
    let within = |part| Layered::<Cpu>::within(&model, part);
    let (features, head) = (within(0..cut), within(cut..params.len()));
    let pixels: Vec<f32> = (0..5 * IMAGE_SIDE * IMAGE_SIDE)
        .map(|i| (i % 97) as f32 / 97.0)
        .collect();
    let chain = || {
        let mut chain: Activations<Cpu> = Chain::new(&model, &b, 5, false).unwrap();
        b.write_range(&pixels, &mut chain.cuts[0], 0).unwrap();
        chain
    };
    let (mut whole, mut split) = (chain(), chain());
    let all = b.upload(&params).unwrap();
    Model::forward(&model, &b, &mut whole, &all, Mode::Eval).unwrap();
    let parts = [
        (&features, b.upload(&params[..cut]).unwrap(), 0..2),
        (&head, b.upload(&params[cut..]).unwrap(), 2..4),
    ];
    for (stage, part, segments) in &parts {
        for s in segments.clone() {
            let (before, after) = split.cuts.split_at_mut(s + 1);
            let acts = &mut split.acts[s];
            stage
                .forward_segment(
                    &b,
                    (s, 5),
                    &before[s],
                    &mut after[0],
                    acts,
                    part,
                    Mode::Eval,
                )
                .unwrap();
        }
    }
    let (before, after) = split.cuts.split_at_mut(1);
    let refused = head.forward_segment(
        &b,
        (0, 5),
        &before[0],
        &mut after[0],
        &mut split.acts[0],
        &parts[1].1,
        Mode::Eval,
    );
    let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let logits = |a: &Activations<Cpu>| bits(b.download(a.cuts.last().unwrap()).unwrap());
    assert_eq!(logits(&split), logits(&whole));
    assert!(refused.is_err());
}
