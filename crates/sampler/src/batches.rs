//! Grouping one rank's indices into mini-batches.

use crate::config::SamplerError;

/// Iterator over consecutive chunks of a rank's indices. Owns the index list
/// so a training loop can hold it across the epoch without borrowing the
/// sampler. The final chunk may be shorter than the batch size.
#[derive(Debug, Clone)]
pub struct Batches {
    indices: Vec<usize>,
    batch_size: usize,
    next: usize,
}

impl Batches {
    /// Groups `indices` into chunks of `batch_size`, rejecting a zero size
    /// (which would yield empty batches forever).
    pub fn new(indices: Vec<usize>, batch_size: usize) -> Result<Self, SamplerError> {
        if batch_size == 0 {
            return Err(SamplerError::ZeroBatchSize);
        }
        Ok(Self {
            indices,
            batch_size,
            next: 0,
        })
    }
}

impl Iterator for Batches {
    type Item = Vec<usize>;

    fn next(&mut self) -> Option<Vec<usize>> {
        if self.next >= self.indices.len() {
            return None;
        }
        let end = (self.next + self.batch_size).min(self.indices.len());
        let batch = self.indices[self.next..end].to_vec();
        self.next = end;
        Some(batch)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = (self.indices.len() - self.next).div_ceil(self.batch_size);
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for Batches {}

#[cfg(test)]
mod tests {
    use super::Batches;
    use crate::SamplerError;

    #[test]
    fn keeps_the_short_last_batch() {
        let batches: Vec<_> = Batches::new((0..7).collect(), 3).unwrap().collect();
        assert_eq!(batches, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
    }

    #[test]
    fn reports_its_exact_length() {
        let mut batches = Batches::new((0..7).collect(), 3).unwrap();
        assert_eq!(batches.len(), 3);
        batches.next();
        assert_eq!(batches.len(), 2);
        assert_eq!(Batches::new(Vec::new(), 4).unwrap().len(), 0);
    }

    #[test]
    fn rejects_zero_batch_size() {
        assert_eq!(
            Batches::new(vec![1, 2], 0).unwrap_err(),
            SamplerError::ZeroBatchSize
        );
    }
}
