use super::*;
use crate::testing::cpu;

const G: OffsetGeom = OffsetGeom { batch: 3, k: 2 };

#[test]
fn adds_each_samples_offsets_and_hands_back_its_gradient() {
    let mut y = vec![1.0, 2.0, 3.0];
    let offsets = vec![0.5, 0.25, -1.0, 0.0, 10.0, -10.0];
    cpu().offset_fwd(&G, &offsets, &mut y).unwrap();
    assert_eq!(y, vec![1.75, 1.0, 3.0]);
    let mut d = vec![9.0; 6];
    cpu().offset_bwd(&G, &vec![0.1, -0.2, 0.3], &mut d).unwrap();
    assert_eq!(d, vec![0.1, 0.1, -0.2, -0.2, 0.3, 0.3]);
}

#[test]
fn wrong_lengths_are_errors() {
    let err = cpu()
        .offset_fwd(&G, &vec![0.0; 5], &mut vec![0.0; 3])
        .unwrap_err();
    assert!(err.to_string().contains("offsets"), "{err}");
    let err = cpu()
        .offset_bwd(&G, &vec![0.0; 2], &mut vec![0.0; 6])
        .unwrap_err();
    assert!(err.to_string().contains('y'), "{err}");
}
