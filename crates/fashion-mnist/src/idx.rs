//! Parser for the IDX format of the (Fashion-)MNIST files.
//!
//! An IDX file is a big-endian header (a magic number whose low byte is the
//! number of dimensions and whose third byte is the element type, 0x08 for
//! unsigned bytes), one `u32` per dimension, then the elements in row-major
//! order. Only the two shapes FashionMNIST uses are accepted.

use crate::error::Corruption;
use crate::{COLS, ROWS};

/// The two file kinds of the data set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdxKind {
    /// `[count, 28, 28]` unsigned bytes.
    Images,
    /// `[count]` unsigned bytes.
    Labels,
}

impl IdxKind {
    /// Magic number: type 0x08 (u8) and 3 dimensions.
    pub(crate) const IMAGES_MAGIC: u32 = 0x0803;
    /// Magic number: type 0x08 (u8) and 1 dimension.
    pub(crate) const LABELS_MAGIC: u32 = 0x0801;

    fn magic(self) -> u32 {
        match self {
            Self::Images => Self::IMAGES_MAGIC,
            Self::Labels => Self::LABELS_MAGIC,
        }
    }

    fn description(self) -> &'static str {
        match self {
            Self::Images => "an IDX file of 3-D unsigned bytes, i.e. images",
            Self::Labels => "an IDX file of 1-D unsigned bytes, i.e. labels",
        }
    }

    fn header_len(self) -> usize {
        match self {
            Self::Images => 16,
            Self::Labels => 8,
        }
    }

    fn item_len(self) -> usize {
        match self {
            Self::Images => ROWS * COLS,
            Self::Labels => 1,
        }
    }

    /// Full decompressed length of a file holding `count` items.
    pub(crate) fn file_len(self, count: usize) -> usize {
        self.header_len() + count * self.item_len()
    }
}

/// The item count a file declares, read before its payload is validated so
/// that two files of a split can be compared first.
pub(crate) struct Header {
    pub(crate) count: usize,
    kind: IdxKind,
}

/// Validates the header of `content` as `kind`.
pub(crate) fn parse_header(content: &[u8], kind: IdxKind) -> Result<Header, Corruption> {
    let truncated = |expected| Corruption::TruncatedIdx {
        expected,
        found: content.len(),
    };
    let magic = read_u32(content, 0).ok_or_else(|| truncated(4))?;
    if magic != kind.magic() {
        return Err(Corruption::BadMagic {
            expected: kind.magic(),
            found: magic,
            kind: kind.description(),
        });
    }
    let header_field =
        |offset| read_u32(content, offset).ok_or_else(|| truncated(kind.header_len()));
    let count = header_field(4)?;
    if kind == IdxKind::Images {
        let (rows, cols) = (header_field(8)?, header_field(12)?);
        if (rows, cols) != (ROWS as u32, COLS as u32) {
            return Err(Corruption::BadDimensions { rows, cols });
        }
    }
    Ok(Header {
        count: count as usize,
        kind,
    })
}

impl Header {
    /// Checks the count against the split's and the payload length against
    /// the count, then strips the header from `content`, leaving the items.
    pub(crate) fn into_payload(
        self,
        mut content: Vec<u8>,
        expected_count: usize,
    ) -> Result<Vec<u8>, Corruption> {
        if self.count != expected_count {
            return Err(Corruption::WrongCount {
                expected: expected_count,
                found: self.count,
            });
        }
        let expected_len = self.kind.file_len(self.count);
        if content.len() < expected_len {
            return Err(Corruption::TruncatedIdx {
                expected: expected_len,
                found: content.len(),
            });
        }
        if content.len() > expected_len {
            return Err(Corruption::TrailingBytes {
                expected: expected_len,
            });
        }
        content.drain(..self.kind.header_len());
        Ok(content)
    }
}

/// Rejects the first label that is not a class.
pub(crate) fn check_labels(labels: &[u8]) -> Result<(), Corruption> {
    match labels
        .iter()
        .position(|&label| usize::from(label) >= crate::CLASSES)
    {
        Some(index) => Err(Corruption::LabelOutOfRange {
            index,
            label: labels[index],
        }),
        None => Ok(()),
    }
}

fn read_u32(content: &[u8], offset: usize) -> Option<u32> {
    let bytes = content.get(offset..offset + 4)?;
    Some(u32::from_be_bytes(bytes.try_into().ok()?))
}
