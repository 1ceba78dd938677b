use super::*;
use crate::testing::cpu;

/// Two ids into a table of 3 rows of 2 at offset 1 of a flat buffer of 8;
/// the id and row buffers have room for one more.
const G: RowsGeom = RowsGeom {
    count: 2,
    dim: 2,
    rows: 3,
    offset: 1,
};

#[test]
fn gather_copies_the_rows_out_and_leaves_the_rest() {
    let flat: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let mut rows = vec![-1.0; 6];
    cpu()
        .rows_gather(&G, &vec![0, 2, 9], &flat, &mut rows)
        .unwrap();
    assert_eq!(rows, vec![1.0, 2.0, 5.0, 6.0, -1.0, -1.0]);
}

#[test]
fn scatter_writes_only_the_rows_named() {
    let mut flat = vec![9.0f32; 8];
    let rows = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    cpu()
        .rows_scatter(&G, &vec![1, 2, 0], &rows, &mut flat)
        .unwrap();
    assert_eq!(flat, vec![9.0, 9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 9.0]);
}

#[test]
fn bad_ids_and_short_buffers_are_errors_that_write_nothing() {
    let mut flat = vec![9.0f32; 8];
    let rows = vec![1.0; 4];
    for (ids, what) in [
        (vec![0, 3], "id 3 (at 1) is not below the table's 3 rows"),
        (vec![2, 2], "ids must increase: 2 then 2 at 1"),
        (vec![2, 1], "ids must increase: 2 then 1 at 1"),
    ] {
        let err = cpu().rows_scatter(&G, &ids, &rows, &mut flat).unwrap_err();
        assert!(err.to_string().contains(what), "{err}");
        let mut out = vec![0.0; 4];
        assert!(cpu().rows_gather(&G, &ids, &flat, &mut out).is_err());
    }
    assert_eq!(flat, vec![9.0; 8]);
    let short = cpu().rows_scatter(&G, &vec![0], &rows, &mut flat);
    assert!(short.unwrap_err().to_string().contains("ids holds 1"));
    let mut small = vec![0.0; 3];
    let short = cpu().rows_gather(&G, &vec![0, 1], &flat, &mut small);
    assert!(short.unwrap_err().to_string().contains("rows holds 3"));
    let big = RowsGeom { rows: 4, ..G };
    assert!(
        cpu()
            .rows_scatter(&big, &vec![0, 1], &rows, &mut flat)
            .is_err()
    );
}
