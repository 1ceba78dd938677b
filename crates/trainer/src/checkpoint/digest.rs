//! The checksum a checkpoint file carries in its `__metadata__["sha256"]`.
//!
//! It covers what the file means rather than its bytes (which hold the
//! checksum itself, and JSON whose layout is the writer's business):
//! SHA-256 over, each string and byte run preceded by its length as a u64
//! little-endian,
//!
//! 1. every metadata entry but `sha256`, sorted by key: key, value;
//! 2. every tensor, sorted by name: name, the number of dimensions (u64 LE),
//!    each dimension (u64 LE), the raw little-endian data.
//!
//! A flipped bit anywhere in the data, or in a metadata value, or a
//! truncation, changes it; reproducing it in Python takes a dozen lines.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The metadata key holding the checksum.
pub const KEY: &str = "sha256";

/// One tensor as the checksum sees it.
pub struct TensorBytes<'a> {
    pub shape: &'a [usize],
    pub data: &'a [u8],
}

/// The hex SHA-256 of `metadata` (without [`KEY`]) and `tensors`.
pub fn compute<'a>(
    metadata: &BTreeMap<&str, &str>,
    tensors: &BTreeMap<&str, TensorBytes<'a>>,
) -> String {
    fn put(hash: &mut Sha256, bytes: &[u8]) {
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    }
    let mut hash = Sha256::new();
    for (key, value) in metadata.iter().filter(|(k, _)| **k != KEY) {
        put(&mut hash, key.as_bytes());
        put(&mut hash, value.as_bytes());
    }
    for (name, tensor) in tensors {
        put(&mut hash, name.as_bytes());
        for dim in std::iter::once(tensor.shape.len()).chain(tensor.shape.iter().copied()) {
            hash.update((dim as u64).to_le_bytes());
        }
        put(&mut hash, tensor.data);
    }
    format!("{:x}", hash.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(meta: &[(&str, &str)], shape: &[usize], data: &[u8]) -> String {
        compute(
            &meta.iter().copied().collect(),
            &BTreeMap::from([("w", TensorBytes { shape, data })]),
        )
    }

    #[test]
    fn every_part_counts_and_the_checksum_itself_does_not() {
        let data = [1u8, 2, 3, 4, 5, 6, 7, 8];
        let base = of(&[("epoch", "2")], &[2], &data);
        assert_eq!(base.len(), 64);
        assert_eq!(base, of(&[("epoch", "2"), (KEY, "anything")], &[2], &data));
        assert_ne!(base, of(&[("epoch", "3")], &[2], &data));
        assert_ne!(base, of(&[("epoch", "2")], &[1, 2], &data));
        assert_ne!(base, of(&[("epoch", "2")], &[2], &[1, 2, 3, 4, 5, 6, 7, 9]));
    }
}
