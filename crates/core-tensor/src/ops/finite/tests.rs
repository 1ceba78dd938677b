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
