//! One split (train or test): the images and labels of a pair of IDX files.

use crate::PIXELS;
use crate::error::{Corruption, DataError};
use crate::gzip;
use crate::idx::{self, IdxKind};
use std::path::Path;

/// The validated content of one split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split {
    /// `len * 28 * 28` raw pixels, image after image, row-major, 0 = background.
    pub images: Vec<u8>,
    /// `len` labels, each in `0..10`.
    pub labels: Vec<u8>,
    /// Number of examples.
    pub len: usize,
}

impl Split {
    /// Reads and validates a pair of gzip'ed IDX files that must hold exactly
    /// `expected_len` examples.
    ///
    /// The count is a parameter (rather than fixed at 60,000 / 10,000) so that
    /// small synthetic files exercise the same code path as the real ones.
    pub fn read(
        images_path: &Path,
        labels_path: &Path,
        expected_len: usize,
    ) -> Result<Self, DataError> {
        let images_content = read_gz(images_path, IdxKind::Images.file_len(expected_len))?;
        let labels_content = read_gz(labels_path, IdxKind::Labels.file_len(expected_len))?;
        let corrupt = |path: &Path| {
            let path = path.to_path_buf();
            move |problem| DataError::Corrupt { path, problem }
        };

        let images_header =
            idx::parse_header(&images_content, IdxKind::Images).map_err(corrupt(images_path))?;
        let labels_header =
            idx::parse_header(&labels_content, IdxKind::Labels).map_err(corrupt(labels_path))?;
        if images_header.count != labels_header.count {
            return Err(DataError::CountMismatch {
                images_path: images_path.to_path_buf(),
                images: images_header.count,
                labels_path: labels_path.to_path_buf(),
                labels: labels_header.count,
            });
        }
        let images = images_header
            .into_payload(images_content, expected_len)
            .map_err(corrupt(images_path))?;
        let labels = labels_header
            .into_payload(labels_content, expected_len)
            .map_err(corrupt(labels_path))?;
        idx::check_labels(&labels).map_err(corrupt(labels_path))?;
        Ok(Self {
            images,
            labels,
            len: expected_len,
        })
    }

    /// Its first `n` examples (all of them when it holds no more).
    pub fn first(mut self, n: usize) -> Self {
        self.len = self.len.min(n);
        self.images.truncate(self.len * PIXELS);
        self.labels.truncate(self.len);
        self
    }

    /// The pixels of example `index`, or `None` past the end.
    pub fn image(&self, index: usize) -> Option<&[u8]> {
        self.images
            .get(index.checked_mul(PIXELS)?..(index.checked_add(1)?).checked_mul(PIXELS)?)
    }
}

/// Reads and inflates `path`, at most one byte past `max_len`: the length its
/// header must announce for the split, so a gzip bomb costs no more memory
/// than the real file before it is refused.
fn read_gz(path: &Path, max_len: usize) -> Result<Vec<u8>, DataError> {
    let gz = std::fs::read(path).map_err(|source| DataError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    gzip::decompress(&gz, max_len).map_err(|problem: Corruption| DataError::Corrupt {
        path: path.to_path_buf(),
        problem,
    })
}
