use super::*;
use crate::testing::cpu;

/// A table of 3 rows of 2 at offset 1 of a flat buffer of 8.
const G: EmbeddingGeom = EmbeddingGeom {
    batch: 4,
    dim: 2,
    rows: 3,
    offset: 1,
};

#[test]
fn forward_gathers_rows() {
    let params: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let mut out = vec![0.0; 8];
    cpu()
        .embedding_fwd(&G, &vec![2, 0, 2, 1], &params, &mut out)
        .unwrap();
    assert_eq!(out, vec![5.0, 6.0, 1.0, 2.0, 5.0, 6.0, 3.0, 4.0]);
}

/// torch: `nn.Embedding(3, 2)` on ids [2, 0, 2, 1] with `out.backward(dout)`
/// gives `weight.grad` = [[dout1], [dout3], [dout0 + dout2]].
#[test]
fn backward_sums_repeated_ids_and_zeroes_the_rest() {
    let dout = vec![1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 0.5, 0.25];
    let mut grads = vec![9.0f32; 8];
    cpu()
        .embedding_bwd(&G, &vec![2, 0, 2, 2], &dout, &mut grads)
        .unwrap();
    assert_eq!(
        grads,
        vec![9.0, 10.0, 20.0, 0.0, 0.0, 101.5, 202.25, 9.0],
        "outside the table untouched, row 1 zero"
    );
}

/// As above, adding to what the table held and zeroing nothing.
#[test]
fn backward_add_adds_to_the_rows_named_only() {
    let dout = vec![1.0, 2.0, 10.0, 20.0, 100.0, 200.0, 0.5, 0.25];
    let mut grads = vec![9.0f32; 8];
    cpu()
        .embedding_bwd_add(&G, &vec![2, 0, 2, 2], &dout, &mut grads)
        .unwrap();
    assert_eq!(grads, vec![9.0, 19.0, 29.0, 9.0, 9.0, 110.5, 211.25, 9.0]);
    let err = cpu().embedding_bwd_add(&G, &vec![0, 3, 0, 0], &dout, &mut grads);
    assert!(err.is_err());
}

#[test]
fn bad_ids_and_tables_are_errors() {
    let (params, mut out) = (vec![0.0f32; 8], vec![0.0; 8]);
    let err = cpu()
        .embedding_fwd(&G, &vec![0, 3, 0, 0], &params, &mut out)
        .unwrap_err();
    assert!(err.to_string().contains("id 3"), "{err}");
    let mut grads = vec![0.0; 8];
    assert!(
        cpu()
            .embedding_bwd(&G, &vec![0, 0, 0, 7], &out, &mut grads)
            .is_err()
    );
    let big = EmbeddingGeom { rows: 4, ..G };
    assert!(
        cpu()
            .embedding_fwd(&big, &vec![0; 4], &params, &mut out)
            .is_err()
    );
}
