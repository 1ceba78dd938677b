//! The four published files and their known-good content.

use crate::error::Corruption;
use crate::gzip;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;

/// Training images file name.
pub const TRAIN_IMAGES: &str = "train-images-idx3-ubyte.gz";
/// Training labels file name.
pub const TRAIN_LABELS: &str = "train-labels-idx1-ubyte.gz";
/// Test images file name.
pub const TEST_IMAGES: &str = "t10k-images-idx3-ubyte.gz";
/// Test labels file name.
pub const TEST_LABELS: &str = "t10k-labels-idx1-ubyte.gz";

/// One published file, identified by its *decompressed* content.
///
/// The digests cover the decompressed bytes because the compressed bytes
/// differ between distributors (Debian recompresses the official files) while
/// the IDX content is identical everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataFile {
    /// File name, as on the official mirror and in Debian's package.
    pub name: &'static str,
    /// Length of the decompressed IDX content in bytes.
    pub decompressed_len: u64,
    /// SHA-256 of the decompressed IDX content, lowercase hex.
    pub sha256: &'static str,
}

/// The four files of the data set, smallest download first.
pub const FILES: [DataFile; 4] = [
    DataFile {
        name: TEST_LABELS,
        decompressed_len: 10_008,
        sha256: "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
    DataFile {
        name: TRAIN_LABELS,
        decompressed_len: 60_008,
        sha256: "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    },
    DataFile {
        name: TEST_IMAGES,
        decompressed_len: 7_840_016,
        sha256: "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    },
    DataFile {
        name: TRAIN_IMAGES,
        decompressed_len: 47_040_016,
        sha256: "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    },
];

impl DataFile {
    /// Checks that `gz` (a whole gzip file) decompresses to exactly this
    /// file's published content; used to verify downloads before they are
    /// moved into place.
    pub fn verify_gz(&self, gz: &[u8]) -> Result<(), Corruption> {
        let mut hasher = Sha256::new();
        let mut len = 0u64;
        gzip::for_each_chunk(gz, |chunk| {
            hasher.update(chunk);
            len += chunk.len() as u64;
        })?;
        if len != self.decompressed_len {
            return Err(Corruption::WrongLength {
                expected: self.decompressed_len,
                found: len,
            });
        }
        let found = hasher
            .finalize()
            .iter()
            .fold(String::new(), |mut hex, byte| {
                // Writing into a String cannot fail.
                let _ = write!(hex, "{byte:02x}");
                hex
            });
        if found != self.sha256 {
            return Err(Corruption::ChecksumMismatch {
                expected: self.sha256,
                found,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{FILES, TEST_LABELS};
    use crate::error::Corruption;
    use crate::synth;
    use flate2::Compression;
    use flate2::write::GzEncoder;
    use std::io::Write;

    fn gzip(content: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::fast());
        encoder.write_all(content).expect("write to Vec");
        encoder.finish().expect("finish to Vec")
    }

    fn test_labels() -> &'static super::DataFile {
        FILES
            .iter()
            .find(|file| file.name == TEST_LABELS)
            .expect("listed")
    }

    #[test]
    fn rejects_content_of_the_wrong_length() {
        assert_eq!(
            test_labels().verify_gz(&gzip(&synth::labels_idx(5))),
            Err(Corruption::WrongLength {
                expected: 10_008,
                found: 13
            })
        );
    }

    #[test]
    fn rejects_content_with_the_right_length_but_other_bytes() {
        // 10,000 synthetic labels are exactly as long as the real file.
        let err = test_labels()
            .verify_gz(&gzip(&synth::labels_idx(10_000)))
            .unwrap_err();
        assert!(
            matches!(&err, Corruption::ChecksumMismatch { expected, found }
                if *expected == test_labels().sha256 && found.len() == 64),
            "{err:?}"
        );
    }

    #[test]
    fn rejects_damaged_gzip_before_hashing() {
        assert_eq!(
            test_labels().verify_gz(b"not gzip"),
            Err(Corruption::NotGzip {
                found: b"no".to_vec()
            })
        );
    }

    #[test]
    fn table_lists_each_file_once_with_a_full_digest() {
        let mut names: Vec<_> = FILES.iter().map(|file| file.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), 4);
        for file in &FILES {
            assert_eq!(file.sha256.len(), 64, "{}", file.name);
            assert!(
                file.sha256
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
            );
        }
    }
}
