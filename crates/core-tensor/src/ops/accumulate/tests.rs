use super::*;
use crate::testing::cpu;

#[test]
fn micro_batches_sum_weighted_in_order_into_the_last_ones_gradients() {
    let cpu = cpu();
    let mut acc = vec![0.0f32; 3];
    // torch: grad = g1 * 0.25; grad.add_(g2, alpha=0.25); ...
    let micro = [[1.0f32, -2.0, 0.5], [3.0, 0.0, -0.5], [0.25, 8.0, 1.0]];
    for g in &micro[..2] {
        let mut g = g.to_vec();
        cpu.accumulate(0.25, &mut g, &mut acc, 0..3, SumInto::Acc)
            .unwrap();
    }
    assert_eq!(acc, [1.0, -0.5, 0.0]);
    let mut last = micro[2].to_vec();
    cpu.accumulate(0.5, &mut last, &mut acc, 0..3, SumInto::Grads)
        .unwrap();
    assert_eq!(last, [1.125, 3.5, 0.5]);
    assert_eq!(acc, [1.0, -0.5, 0.0], "the accumulator is read only");
}

#[test]
fn only_the_range_changes() {
    let cpu = cpu();
    let mut g = vec![1.0f32; 4];
    let mut acc = vec![2.0f32; 4];
    cpu.accumulate(3.0, &mut g, &mut acc, 1..3, SumInto::Grads)
        .unwrap();
    assert_eq!(g, [1.0, 5.0, 5.0, 1.0]);
}

#[test]
fn bad_lengths_and_ranges_are_errors() {
    let cpu = cpu();
    let (mut g, mut acc) = (vec![0.0f32; 3], vec![0.0f32; 2]);
    assert!(
        cpu.accumulate(1.0, &mut g, &mut acc, 0..2, SumInto::Acc)
            .is_err()
    );
    let mut acc = vec![0.0f32; 3];
    let err = cpu
        .accumulate(1.0, &mut g, &mut acc, 2..4, SumInto::Acc)
        .unwrap_err();
    assert!(err.to_string().contains("2..4"), "{err}");
}
