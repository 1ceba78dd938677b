//! Every way a data file can be wrong, each asserted on its one-line message.

use fashion_mnist::{
    Corruption, DataError, FashionMnist, Layout, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS, locate,
    synth,
};
use std::fs;
use std::path::Path;

const SMALL: Layout = Layout {
    train_len: 20,
    test_len: 10,
};

/// A valid small data set in a fresh temporary directory.
fn valid_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    synth::write_dataset(dir.path(), SMALL).unwrap();
    dir
}

fn load(dir: &Path) -> DataError {
    FashionMnist::load_with(dir, SMALL).expect_err("the data set was damaged")
}

/// Asserts a single-line message that names `file` and contains `needle`.
fn assert_message(err: &DataError, file: &str, needle: &str) {
    let message = err.to_string();
    assert!(!message.contains('\n'), "not one line: {message}");
    assert!(message.contains(file), "does not name {file}: {message}");
    assert!(
        message.contains(needle),
        "does not say {needle:?}: {message}"
    );
}

fn problem(err: &DataError) -> &Corruption {
    match err {
        DataError::Corrupt { problem, .. } => problem,
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn missing_explicit_dir_names_it_and_both_fixes() {
    let dir = tempfile::tempdir().unwrap();
    let absent = dir.path().join("nowhere");
    let err = locate(Some(&absent)).unwrap_err();
    assert!(matches!(err, DataError::NotFound { explicit: true, .. }));
    let message = err.to_string();
    assert!(
        message.contains(&format!("{} (no such directory)", absent.display())),
        "{message}"
    );
    assert!(
        message.contains("sudo apt-get install dataset-fashion-mnist"),
        "{message}"
    );
    assert!(message.contains("data/fashion-mnist"), "{message}");
    assert!(message.contains("cargo xtask fetch-data"), "{message}");
    assert!(message.contains("--data-dir"), "{message}");
    assert!(
        !message.contains("/usr/share"),
        "explicit dir must not fall back: {message}"
    );
}

#[test]
fn explicit_dir_with_all_files_is_used() {
    let dir = valid_dir();
    assert_eq!(locate(Some(dir.path())).unwrap(), dir.path());
}

#[test]
fn missing_file_is_a_read_error_naming_it() {
    let dir = valid_dir();
    fs::remove_file(dir.path().join(TEST_LABELS)).unwrap();
    let err = load(dir.path());
    assert!(matches!(err, DataError::Read { .. }), "{err:?}");
    assert_message(&err, TEST_LABELS, "cannot read");
}

#[test]
fn truncated_gzip_is_reported() {
    let dir = valid_dir();
    let path = dir.path().join(TRAIN_IMAGES);
    let gz = fs::read(&path).unwrap();
    fs::write(&path, &gz[..gz.len() / 2]).unwrap();
    let err = load(dir.path());
    assert_eq!(problem(&err), &Corruption::TruncatedGzip);
    assert_message(&err, TRAIN_IMAGES, "truncated gzip stream");
}

#[test]
fn non_gzip_file_is_reported() {
    let dir = valid_dir();
    fs::write(dir.path().join(TRAIN_LABELS), synth::labels_idx(20)).unwrap();
    let err = load(dir.path());
    assert!(matches!(problem(&err), Corruption::NotGzip { .. }));
    assert_message(&err, TRAIN_LABELS, "not a gzip file");
}

#[test]
fn empty_file_is_reported() {
    let dir = valid_dir();
    fs::write(dir.path().join(TRAIN_LABELS), b"").unwrap();
    assert_message(&load(dir.path()), TRAIN_LABELS, "file is empty");
}

#[test]
fn wrong_magic_is_reported() {
    let dir = valid_dir();
    // A label file where the image file should be.
    synth::write_gz(&dir.path().join(TRAIN_IMAGES), &synth::labels_idx(20)).unwrap();
    let err = load(dir.path());
    assert!(matches!(
        problem(&err),
        Corruption::BadMagic {
            expected: 2051,
            found: 2049,
            ..
        }
    ));
    assert_message(&err, TRAIN_IMAGES, "magic number 2049, expected 2051");
}

#[test]
fn wrong_dimensions_are_reported() {
    let dir = valid_dir();
    let mut content = synth::idx_header(0x0803, &[20, 32, 32]);
    content.resize(16 + 20 * 32 * 32, 0);
    synth::write_gz(&dir.path().join(TRAIN_IMAGES), &content).unwrap();
    let err = load(dir.path());
    assert_eq!(
        problem(&err),
        &Corruption::BadDimensions { rows: 32, cols: 32 }
    );
    assert_message(&err, TRAIN_IMAGES, "images are 32x32, expected 28x28");
}

#[test]
fn image_and_label_counts_must_agree() {
    let dir = valid_dir();
    synth::write_gz(&dir.path().join(TRAIN_LABELS), &synth::labels_idx(19)).unwrap();
    let err = load(dir.path());
    assert!(
        matches!(
            err,
            DataError::CountMismatch {
                images: 20,
                labels: 19,
                ..
            }
        ),
        "{err:?}"
    );
    assert_message(&err, TRAIN_IMAGES, "holds 20 images but");
    assert_message(&err, TRAIN_LABELS, "holds 19 labels");
}

#[test]
fn split_size_must_match_the_layout() {
    let dir = valid_dir();
    synth::write_gz(&dir.path().join(TRAIN_IMAGES), &synth::images_idx(21)).unwrap();
    synth::write_gz(&dir.path().join(TRAIN_LABELS), &synth::labels_idx(21)).unwrap();
    let err = load(dir.path());
    assert_eq!(
        problem(&err),
        &Corruption::WrongCount {
            expected: 20,
            found: 21
        }
    );
    assert_message(&err, TRAIN_IMAGES, "holds 21 items, expected 20");
}

#[test]
fn truncated_idx_content_is_reported() {
    let dir = valid_dir();
    let mut content = synth::images_idx(20);
    content.truncate(content.len() - 1);
    synth::write_gz(&dir.path().join(TRAIN_IMAGES), &content).unwrap();
    let err = load(dir.path());
    assert_eq!(
        problem(&err),
        &Corruption::TruncatedIdx {
            expected: 16 + 20 * 784,
            found: 16 + 20 * 784 - 1
        }
    );
    assert_message(&err, TRAIN_IMAGES, "truncated IDX content");
}

#[test]
fn truncated_header_is_reported() {
    let dir = valid_dir();
    synth::write_gz(&dir.path().join(TEST_LABELS), &[0, 0, 8]).unwrap();
    let err = load(dir.path());
    assert_eq!(
        problem(&err),
        &Corruption::TruncatedIdx {
            expected: 4,
            found: 3
        }
    );
    assert_message(&err, TEST_LABELS, "3 bytes, expected 4");
}

#[test]
fn trailing_idx_bytes_are_reported() {
    let dir = valid_dir();
    let mut content = synth::labels_idx(10);
    content.extend_from_slice(b"extra");
    synth::write_gz(&dir.path().join(TEST_LABELS), &content).unwrap();
    let err = load(dir.path());
    assert_eq!(problem(&err), &Corruption::TrailingBytes { expected: 18 });
    assert_message(&err, TEST_LABELS, "unexpected bytes after the last item");
}

#[test]
fn gzip_bomb_is_refused_without_inflating_it() {
    // 64 MiB of zeros compress to ~64 KB; inflating stops one byte past
    // the 15,696 bytes the header announces (the memory bound is recorded
    // in docs/security.md, measured on a 2 GiB bomb).
    let dir = valid_dir();
    let mut content = synth::images_idx(SMALL.train_len);
    content.resize(content.len() + (64 << 20), 0);
    synth::write_gz(&dir.path().join(TRAIN_IMAGES), &content).unwrap();
    let err = load(dir.path());
    assert_eq!(
        problem(&err),
        &Corruption::TrailingBytes {
            expected: 16 + 20 * 784
        }
    );
    assert_message(&err, TRAIN_IMAGES, "inflating stopped there");
}

#[test]
fn trailing_gzip_bytes_are_reported() {
    let dir = valid_dir();
    let path = dir.path().join(TEST_LABELS);
    let mut gz = fs::read(&path).unwrap();
    gz.extend_from_slice(b"\0\0garbage");
    fs::write(&path, gz).unwrap();
    let err = load(dir.path());
    assert_eq!(problem(&err), &Corruption::TrailingGzipData { extra: 9 });
    assert_message(
        &err,
        TEST_LABELS,
        "9 bytes of trailing data after the gzip stream",
    );
}

#[test]
fn label_out_of_range_is_reported() {
    let dir = valid_dir();
    let mut content = synth::labels_idx(10);
    content[8 + 7] = 10;
    synth::write_gz(&dir.path().join(TEST_LABELS), &content).unwrap();
    let err = load(dir.path());
    assert_eq!(
        problem(&err),
        &Corruption::LabelOutOfRange {
            index: 7,
            label: 10
        }
    );
    assert_message(&err, TEST_LABELS, "label 10 of item 7 is not a class");
}
