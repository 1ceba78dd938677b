use std::sync::Arc;

use super::*;
use crate::testing::cpu;

#[test]
fn gathers_rows_by_index_and_scales_like_to_tensor() {
    let images = Arc::new(vec![0u8, 255, 10, 20, 51, 102]);
    let labels = Arc::new(vec![4u8, 5, 6]);
    let indices: Vec<u32> = vec![9, 2, 0, 9];
    let (mut x, mut y) = (vec![0.0; 4], vec![0; 2]);
    cpu()
        .gather_batch(
            &images,
            &labels,
            2,
            &indices,
            1..3,
            Some(&mut x),
            Some(&mut y),
        )
        .unwrap();
    assert_eq!(x, vec![51.0 / 255.0, 102.0 / 255.0, 0.0, 1.0]);
    assert_eq!(y, vec![6, 4]);
}

/// A pipeline's first stage gathers the images alone, its last the labels
/// alone: each half as the whole gather writes it, the other untouched.
#[test]
fn either_half_is_gathered_alone() {
    let images = Arc::new(vec![0u8, 255, 10, 20, 51, 102]);
    let labels = Arc::new(vec![4u8, 5, 6]);
    let indices: Vec<u32> = vec![2, 0];
    let mut x = vec![0.0; 4];
    cpu()
        .gather_batch(&images, &labels, 2, &indices, 0..2, Some(&mut x), None)
        .unwrap();
    assert_eq!(x, vec![51.0 / 255.0, 102.0 / 255.0, 0.0, 1.0]);
    let mut y = vec![0; 2];
    cpu()
        .gather_batch(&images, &labels, 2, &indices, 0..2, None, Some(&mut y))
        .unwrap();
    assert_eq!(y, vec![6, 4]);
    let err = cpu()
        .gather_batch(&images, &labels, 2, &indices, 0..2, None, None)
        .unwrap_err();
    assert!(err.to_string().contains("pass `x`, `y` or both"), "{err}");
}

#[test]
fn out_of_range_indices_are_errors() {
    let (images, labels) = (Arc::new(vec![0u8; 4]), Arc::new(vec![0u8; 2]));
    let indices = vec![0u32, 9];
    let (mut x, mut y) = (vec![0.0; 4], vec![0; 2]);
    let err = cpu()
        .gather_batch(
            &images,
            &labels,
            2,
            &indices,
            0..2,
            Some(&mut x),
            Some(&mut y),
        )
        .unwrap_err();
    assert!(err.to_string().contains("sample index 9"), "{err}");
    let err = cpu()
        .gather_batch(
            &images,
            &labels,
            2,
            &indices,
            1..3,
            Some(&mut x),
            Some(&mut y),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("buffer `x`") || err.to_string().contains("positions"),
        "{err}"
    );
}

#[test]
fn a_shared_data_set_is_the_same_allocation_on_the_cpu() {
    let images = Arc::new(vec![7u8; 6]);
    let (a, b) = (cpu(), crate::Cpu::new(2).unwrap());
    let (mine, theirs) = (a.share(&images).unwrap(), b.share(&images).unwrap());
    assert!(Arc::ptr_eq(&mine, &images) && Arc::ptr_eq(&theirs, &images));
    assert_eq!(Arc::strong_count(&images), 3);
}
