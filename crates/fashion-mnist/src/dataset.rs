//! The whole data set: both splits, read from one directory.

use crate::error::DataError;
use crate::files::{TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS};
use crate::split::Split;
use std::path::{Path, PathBuf};

/// How many examples each split must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Examples in the training split.
    pub train_len: usize,
    /// Examples in the test split.
    pub test_len: usize,
}

impl Layout {
    /// The published FashionMNIST: 60,000 training and 10,000 test examples.
    pub const FASHION_MNIST: Self = Self {
        train_len: 60_000,
        test_len: 10_000,
    };
}

/// Both splits of the data set and the directory they were read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FashionMnist {
    /// The 60,000 training examples.
    pub train: Split,
    /// The 10,000 test examples.
    pub test: Split,
    /// Where the files were read from, for logs and run metadata.
    pub dir: PathBuf,
}

impl FashionMnist {
    /// Reads the four standard files from `dir` (see [`crate::locate`] to find
    /// it) and checks that they hold the published data set's shape.
    pub fn load(dir: &Path) -> Result<Self, DataError> {
        Self::load_with(dir, Layout::FASHION_MNIST)
    }

    /// Like [`Self::load`] but with other split sizes, so tests of code that
    /// consumes the data set can run on tiny files from [`crate::synth`].
    pub fn load_with(dir: &Path, layout: Layout) -> Result<Self, DataError> {
        Ok(Self {
            train: Split::read(
                &dir.join(TRAIN_IMAGES),
                &dir.join(TRAIN_LABELS),
                layout.train_len,
            )?,
            test: Split::read(
                &dir.join(TEST_IMAGES),
                &dir.join(TEST_LABELS),
                layout.test_len,
            )?,
            dir: dir.to_path_buf(),
        })
    }
}
