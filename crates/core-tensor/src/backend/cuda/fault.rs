//! The fault word: kernels that meet input the CPU kernels reject (a label
//! not below the class count, a sample index past the dataset) cannot return
//! an error, so they set a bit in a device word instead and write harmless
//! values. [`super::Cuda`] reads the word whenever it synchronizes and turns
//! set bits into [`crate::Error::KernelFault`]. The bit values are mirrored
//! by `FAULT_*` in the `.cu` files.

/// cross_entropy.cu `FAULT_LABEL`.
const LABEL: u32 = 1;
/// gather.cu `FAULT_INDEX`.
const INDEX: u32 = 2;
/// embedding.cu `FAULT_EMBEDDING`.
const EMBEDDING: u32 = 4;
/// rows.cu `FAULT_ROWS`.
const ROWS: u32 = 8;

/// A sentence naming every fault in `bits`.
pub(super) fn describe(bits: u32) -> String {
    let mut what = Vec::new();
    if bits & LABEL != 0 {
        what.push("cross_entropy: a label is not below the number of classes");
    }
    if bits & INDEX != 0 {
        what.push("gather_batch: a sample index is beyond the dataset");
    }
    if bits & EMBEDDING != 0 {
        what.push("embedding: an id is not below the table's rows");
    }
    if bits & ROWS != 0 {
        what.push("rows: an id is not below the table's rows or not above the one before it");
    }
    if bits & !(LABEL | INDEX | EMBEDDING | ROWS) != 0 {
        what.push("unknown fault bits");
    }
    what.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bit_is_named() {
        assert_eq!(
            describe(LABEL | INDEX),
            "cross_entropy: a label is not below the number of classes; \
             gather_batch: a sample index is beyond the dataset"
        );
        assert_eq!(describe(16), "unknown fault bits");
        assert!(describe(EMBEDDING).starts_with("embedding"));
        assert!(describe(ROWS).starts_with("rows"));
    }
}
