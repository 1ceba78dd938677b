use super::*;
use crate::Cpu;

fn guard_after(steps: &[(u32, f32, Vec<f32>)]) -> GuardState {
    let cpu = Cpu::new(1).unwrap();
    let mut guard = GUARD_CLEAR.to_vec();
    for (step, loss, values) in steps {
        cpu.guard_finite(*step, &vec![*loss], values, &mut guard)
            .unwrap();
    }
    GuardState::from_words([guard[0], guard[1]])
}

#[test]
fn finite_values_leave_the_guard_clear() {
    assert_eq!(
        guard_after(&[(1, 2.5, vec![0.0, -1.0, f32::MAX]), (2, 0.0, vec![])]),
        GuardState::Clear
    );
}

#[test]
fn the_first_bad_step_and_the_smallest_bad_index_are_kept() {
    let state = guard_after(&[
        (1, 1.0, vec![1.0, 2.0, 3.0, 4.0]),
        (2, 1.0, vec![1.0, f32::INFINITY, 3.0, f32::NAN]),
        (3, f32::NAN, vec![f32::NAN, 2.0, 3.0, 4.0]),
    ]);
    assert_eq!(
        state,
        GuardState::Tripped {
            step: 2,
            index: Some(1)
        }
    );
}

#[test]
fn a_bad_loss_alone_trips_the_guard_without_an_index() {
    let state = guard_after(&[(7, f32::NEG_INFINITY, vec![1.0; 10])]);
    assert_eq!(
        state,
        GuardState::Tripped {
            step: 7,
            index: None
        }
    );
}

/// A table of 4 rows of 3 at offset 2 in 20 values, beside dense values.
const TABLE: RowsGeom = RowsGeom {
    count: 2,
    dim: 3,
    rows: 4,
    offset: 2,
};

/// One step checked in parts, as `--sparse-adam` checks it: the dense
/// range after the table, then rows 1 and 3 of the table (ids [1, 3]).
fn parts_after(values: &[f32], loss: f32) -> Vec<u32> {
    let cpu = Cpu::new(1).unwrap();
    let mut guard = GUARD_CLEAR.to_vec();
    let (values, loss) = (values.to_vec(), vec![loss]);
    cpu.guard_finite_range(4, &loss, &values, 14..20, &mut guard)
        .unwrap();
    cpu.guard_finite_rows(4, &TABLE, &vec![1, 3, 0], &values, &mut guard)
        .unwrap();
    guard
}

#[test]
fn each_part_sees_only_its_values_and_the_smallest_index_of_all_parts_is_kept() {
    let with_nan = |at: &[usize]| {
        let mut values = vec![1.0f32; 20];
        at.iter().for_each(|&i| values[i] = f32::NAN);
        values
    };
    // Outside every part: rows 0 and 2 of the table, the values before it.
    assert_eq!(
        parts_after(&with_nan(&[0, 1, 2, 4, 8, 10]), 1.0),
        GUARD_CLEAR
    );
    // The dense range alone, and a table row alone (its flat index).
    assert_eq!(parts_after(&with_nan(&[17]), 1.0), [4, 17]);
    assert_eq!(parts_after(&with_nan(&[13]), 1.0), [4, 13]);
    // The dense range is checked first and finds 15; the table's row 1
    // (flat 5..8) holds 6, smaller: that one.
    assert_eq!(parts_after(&with_nan(&[15, 6, 12]), 1.0), [4, 6]);
    // The loss alone.
    assert_eq!(parts_after(&with_nan(&[]), f32::NAN), [4, u32::MAX]);
}

#[test]
fn a_later_step_leaves_a_tripped_guard_as_it_was_whatever_part_it_checks() {
    let cpu = Cpu::new(1).unwrap();
    let mut guard = vec![3, 9];
    let bad = vec![f32::NAN; 20];
    cpu.guard_finite_range(4, &vec![1.0], &bad, 0..20, &mut guard)
        .unwrap();
    cpu.guard_finite_rows(4, &TABLE, &vec![0, 1], &bad, &mut guard)
        .unwrap();
    assert_eq!(guard, [3, 9]);
}

#[test]
fn bad_rows_and_ranges_are_errors() {
    let cpu = Cpu::new(1).unwrap();
    let (values, mut guard) = (vec![1.0f32; 20], GUARD_CLEAR.to_vec());
    let loss = vec![1.0];
    for (ids, says) in [
        (vec![1], "fewer than the 2 rows"),
        (vec![3, 1], "ids must increase"),
        (vec![1, 4], "not below the table's 4 rows"),
    ] {
        let err = cpu
            .guard_finite_rows(1, &TABLE, &ids, &values, &mut guard)
            .unwrap_err();
        assert!(err.to_string().contains(says), "{ids:?}: {err}");
    }
    let past = RowsGeom { rows: 7, ..TABLE };
    let err = cpu
        .guard_finite_rows(1, &past, &vec![0, 1], &values, &mut guard)
        .unwrap_err();
    assert!(
        err.to_string().contains("not inside the 20 values"),
        "{err}"
    );
    let err = cpu
        .guard_finite_range(1, &loss, &values, 5..21, &mut guard)
        .unwrap_err();
    assert!(
        err.to_string().contains("not inside the 20 values"),
        "{err}"
    );
    assert_eq!(guard, GUARD_CLEAR);
}

#[test]
fn bad_arguments_are_errors() {
    let cpu = Cpu::new(1).unwrap();
    let mut guard = GUARD_CLEAR.to_vec();
    assert!(
        cpu.guard_finite(0, &vec![1.0], &vec![1.0], &mut guard)
            .is_err()
    );
    assert!(
        cpu.guard_finite(1, &vec![], &vec![1.0], &mut guard)
            .is_err()
    );
    assert!(
        cpu.guard_finite(1, &vec![1.0], &vec![1.0], &mut vec![0])
            .is_err()
    );
}
