//! Small synthetic data sets in the real on-disk format.
//!
//! Tests of the loader (and of the trainer, which needs a data set it can
//! read in milliseconds) write these into a temporary directory, optionally
//! after damaging the bytes, instead of depending on the 30 MB real files.
//! The images are learnable: example `i` has label `i % 10` and bright
//! pixels on the diagonals where `(row + col) % 10` equals its label, over
//! low-intensity noise, so a classifier can fit them quickly.

use crate::dataset::Layout;
use crate::files::{TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS};
use crate::idx::IdxKind;
use crate::{CLASSES, COLS, ROWS};
use flate2::Compression;
use flate2::write::GzEncoder;
use std::io::{self, Write};
use std::path::Path;

/// An IDX header: `magic` followed by each dimension, all big-endian `u32`.
/// Exposed so tests can build headers with wrong magic numbers or shapes.
pub fn idx_header(magic: u32, dims: &[u32]) -> Vec<u8> {
    std::iter::once(magic)
        .chain(dims.iter().copied())
        .flat_map(u32::to_be_bytes)
        .collect()
}

/// The label of synthetic example `index`.
pub fn label(index: usize) -> u8 {
    // `index % CLASSES` is below 10, so it always fits in a byte.
    (index % CLASSES) as u8
}

/// A complete IDX image file (header included) of `count` synthetic images.
pub fn images_idx(count: usize) -> Vec<u8> {
    let mut content = idx_header(
        IdxKind::IMAGES_MAGIC,
        &[dim(count), ROWS as u32, COLS as u32],
    );
    content.reserve(count * ROWS * COLS);
    for index in 0..count {
        let class = usize::from(label(index));
        for row in 0..ROWS {
            for col in 0..COLS {
                let pixel = if (row + col) % CLASSES == class {
                    255
                } else {
                    ((index * 31 + row * 7 + col * 13) % 64) as u8
                };
                content.push(pixel);
            }
        }
    }
    content
}

/// A complete IDX label file (header included) of `count` labels.
pub fn labels_idx(count: usize) -> Vec<u8> {
    let mut content = idx_header(IdxKind::LABELS_MAGIC, &[dim(count)]);
    content.extend((0..count).map(label));
    content
}

/// Gzips `content` into `path`.
pub fn write_gz(path: &Path, content: &[u8]) -> io::Result<()> {
    let mut encoder = GzEncoder::new(std::fs::File::create(path)?, Compression::fast());
    encoder.write_all(content)?;
    encoder.finish()?;
    Ok(())
}

/// Writes all four files of a valid synthetic data set of `layout`'s sizes
/// into `dir`, which must exist. Load it with [`crate::FashionMnist::load_with`].
pub fn write_dataset(dir: &Path, layout: Layout) -> io::Result<()> {
    write_gz(&dir.join(TRAIN_IMAGES), &images_idx(layout.train_len))?;
    write_gz(&dir.join(TRAIN_LABELS), &labels_idx(layout.train_len))?;
    write_gz(&dir.join(TEST_IMAGES), &images_idx(layout.test_len))?;
    write_gz(&dir.join(TEST_LABELS), &labels_idx(layout.test_len))
}

/// IDX dimensions are `u32`; a synthetic set never comes close, so saturate
/// rather than fail (the loader then reports the count mismatch).
fn dim(count: usize) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}
