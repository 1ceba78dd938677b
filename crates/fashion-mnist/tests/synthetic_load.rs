//! Loading a valid synthetic data set through the public API.

use fashion_mnist::{FashionMnist, Layout, PIXELS, Split, synth};

const SMALL: Layout = Layout {
    train_len: 30,
    test_len: 12,
};

#[test]
fn loads_what_synth_wrote() {
    let dir = tempfile::tempdir().unwrap();
    synth::write_dataset(dir.path(), SMALL).unwrap();
    let data = FashionMnist::load_with(dir.path(), SMALL).unwrap();

    assert_eq!(data.dir, dir.path());
    assert_eq!((data.train.len, data.test.len), (30, 12));
    assert_eq!(data.train.images.len(), 30 * PIXELS);
    assert_eq!(data.test.labels.len(), 12);
    assert_eq!(
        data.train.labels[..12],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1]
    );
    // The header is stripped: the payload is exactly synth's pixels.
    assert_eq!(data.train.images, synth::images_idx(30)[16..]);
}

#[test]
fn image_accessor_slices_one_example() {
    let dir = tempfile::tempdir().unwrap();
    synth::write_dataset(dir.path(), SMALL).unwrap();
    let split: Split = FashionMnist::load_with(dir.path(), SMALL).unwrap().test;

    let third = split.image(3).expect("in range");
    assert_eq!(third, &split.images[3 * PIXELS..4 * PIXELS]);
    // Label 3's diagonal (row + col == 3) is bright: row 0, col 3.
    assert_eq!(third[3], 255);
    assert!(split.image(11).is_some());
    assert!(split.image(12).is_none());
    assert!(split.image(usize::MAX).is_none());
}

#[test]
fn first_keeps_a_prefix_of_whole_examples() {
    let dir = tempfile::tempdir().unwrap();
    synth::write_dataset(dir.path(), SMALL).unwrap();
    let split: Split = FashionMnist::load_with(dir.path(), SMALL).unwrap().test;

    let five = split.clone().first(5);
    assert_eq!(five.len, 5);
    assert_eq!(five.images, split.images[..5 * PIXELS]);
    assert_eq!(five.labels, split.labels[..5]);
    assert_eq!(split.clone().first(100), split, "no more than it holds");
}

#[test]
fn official_layout_is_rejected_for_small_files() {
    let dir = tempfile::tempdir().unwrap();
    synth::write_dataset(dir.path(), SMALL).unwrap();
    let message = FashionMnist::load(dir.path()).unwrap_err().to_string();
    assert!(message.contains("train-images-idx3-ubyte.gz"), "{message}");
    assert!(
        message.contains("holds 30 items, expected 60000"),
        "{message}"
    );
}
