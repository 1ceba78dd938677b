//! Grouping one rank's indices into mini-batches, by position: the
//! trainer keeps the epoch's index list on its device and gathers each
//! batch there, so it needs where a batch lies in the list, not a copy.

use std::ops::Range;

use crate::config::SamplerError;

/// Iterator over consecutive position ranges of a rank's index list of
/// `len` entries. The final range may be shorter than the batch size.
#[derive(Debug, Clone)]
pub struct BatchPositions {
    len: usize,
    batch_size: usize,
    next: usize,
}

impl BatchPositions {
    /// Splits `0..len` into ranges of `batch_size`, rejecting a zero size
    /// (which would yield empty batches forever).
    pub fn new(len: usize, batch_size: usize) -> Result<Self, SamplerError> {
        if batch_size == 0 {
            return Err(SamplerError::ZeroBatchSize);
        }
        Ok(Self {
            len,
            batch_size,
            next: 0,
        })
    }
}

impl Iterator for BatchPositions {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.next >= self.len {
            return None;
        }
        let end = (self.next + self.batch_size).min(self.len);
        let batch = self.next..end;
        self.next = end;
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = (self.len - self.next).div_ceil(self.batch_size);
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for BatchPositions {}

#[cfg(test)]
mod tests {
    use super::BatchPositions;
    use crate::SamplerError;

    #[test]
    fn keeps_the_short_last_batch() {
        let batches: Vec<_> = BatchPositions::new(7, 3).unwrap().collect();
        assert_eq!(batches, vec![0..3, 3..6, 6..7]);
    }

    #[test]
    fn reports_its_exact_length() {
        let mut batches = BatchPositions::new(7, 3).unwrap();
        assert_eq!(batches.len(), 3);
        batches.next();
        assert_eq!(batches.len(), 2);
        assert_eq!(BatchPositions::new(0, 4).unwrap().len(), 0);
    }

    #[test]
    fn rejects_zero_batch_size() {
        assert_eq!(
            BatchPositions::new(2, 0).unwrap_err(),
            SamplerError::ZeroBatchSize
        );
    }
}
