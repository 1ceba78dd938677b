//! FashionMNIST: finding the four IDX files, reading them and rejecting
//! anything that is not exactly the data set.
//!
//! Images stay as raw `u8` pixels: the trainer converts to `f32 / 255` on the
//! fly and a GPU backend uploads the bytes once, so widening here would only
//! quadruple memory. Every failure is a typed [`DataError`] whose message
//! names the file and what is wrong with it, because a bad data file found
//! an hour into a multi-node job should be diagnosable from one log line.

mod dataset;
mod error;
mod files;
mod gzip;
mod idx;
mod locate;
mod split;
pub mod synth;

pub use dataset::{FashionMnist, Layout};
pub use error::{Corruption, DataError, Found, SearchedDir, Shortfall};
pub use files::{DataFile, FILES, TEST_IMAGES, TEST_LABELS, TRAIN_IMAGES, TRAIN_LABELS};
pub use locate::{LOCAL_DIR, SYSTEM_DIR, locate};
pub use split::Split;

/// Image height in pixels.
pub const ROWS: usize = 28;
/// Image width in pixels.
pub const COLS: usize = 28;
/// Bytes (pixels) per image.
pub const PIXELS: usize = ROWS * COLS;
/// Number of classes; every label is below this.
pub const CLASSES: usize = 10;
/// Human-readable class names, indexed by label, as published with the data set.
pub const CLASS_NAMES: [&str; CLASSES] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];
