use super::*;
use crate::testing::cpu;

#[test]
fn counts_rows_whose_first_maximum_is_the_label() {
    let g = ClassGeom {
        batch: 3,
        classes: 3,
    };
    let logits = vec![
        0.1, 0.9, 0.0, /**/ 2.0, 2.0, 1.0, /**/ -1.0, -3.0, -0.5,
    ];
    let mut correct = vec![5.0];
    cpu()
        .count_correct(&g, &logits, &vec![1, 1, 2], &mut correct)
        .unwrap();
    // Row 2 ties between classes 0 and 1; the first maximum (0) is not the label.
    assert_eq!(correct, vec![7.0]);
}
