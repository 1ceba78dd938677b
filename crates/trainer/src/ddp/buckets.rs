//! Which gradients travel together: PyTorch DDP's bucket rule.

use std::ops::Range;

use anyhow::bail;
use core_tensor::FlatLayout;

const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// The bucket plan for the parameters in `within` (whole tensors of
/// `layout`: all of them, or a pipeline stage's): ranges of a gradient
/// buffer holding just those (element 0 is `within.start`), in the order
/// backward completes them (from the end of the buffer to the start).
pub fn plan_buckets(
    layout: &FlatLayout,
    within: Range<usize>,
    bucket_mb: f64,
) -> Vec<Range<usize>> {
    let cap_bytes = (bucket_mb * 1024.0 * 1024.0).max(1.0) as usize;
    let mut buckets = Vec::new();
    let base = within.start;
    let mut end = within.len();
    let mut bytes = 0;
    let views = layout
        .views()
        .iter()
        .filter(|v| within.contains(&v.range.start));
    for view in views.rev() {
        bytes += view.range.len() * 4;
        let cap = if buckets.is_empty() {
            FIRST_BUCKET_BYTES.min(cap_bytes)
        } else {
            cap_bytes
        };
        if bytes >= cap {
            let start = view.range.start - base;
            buckets.push(start..end);
            end = start;
            bytes = 0;
        }
    }
    if end > 0 {
        buckets.push(0..end);
    }
    buckets
}

/// The buckets of a step in launch order, and how many were launched:
/// what both averagers track while backward reports progress.
pub struct BucketQueue {
    buckets: Vec<Range<usize>>,
    launched: usize,
}

impl BucketQueue {
    pub fn new(buckets: Vec<Range<usize>>) -> Self {
        Self {
            buckets,
            launched: 0,
        }
    }

    pub fn buckets(&self) -> &[Range<usize>] {
        &self.buckets
    }

    /// The next bucket (index and range) that is final once backward has
    /// written every gradient from `offset` on, now counted as launched.
    pub fn next_ready(&mut self, offset: usize) -> Option<(usize, Range<usize>)> {
        let bucket = self.buckets.get(self.launched)?;
        if bucket.start < offset {
            return None;
        }
        self.launched += 1;
        Some((self.launched - 1, bucket.clone()))
    }

    /// Ends the step; an error unless backward launched every bucket.
    pub fn end_step(&mut self) -> anyhow::Result<()> {
        let launched = std::mem::take(&mut self.launched);
        if launched != self.buckets.len() {
            bail!(
                "backward reported {launched} of {} gradient buckets",
                self.buckets.len()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::DropoutRates;
    use crate::models::cnn::CnnMnist;

    #[test]
    fn buckets_follow_pytorchs_rule_and_cover_the_buffer() {
        let model = CnnMnist::new(DropoutRates::REFERENCE);
        let layout = model.layout();
        let fc1 = layout.range("fc1.weight").unwrap().start;
        // fc2 and fc1.bias are only 5.6 kB; fc1.weight pushes the first
        // bucket past 1 MiB and closes it; the rest fits in one 25 MB bucket.
        let all = 0..layout.len();
        assert_eq!(
            plan_buckets(layout, all.clone(), 25.0),
            vec![fc1..layout.len(), 0..fc1]
        );
        // Tiny caps give one bucket per parameter, still contiguous.
        let tiny = plan_buckets(layout, all, 1e-6);
        assert_eq!(tiny.len(), layout.views().len());
        assert_eq!(tiny.first().unwrap().end, layout.len());
        assert_eq!(tiny.last().unwrap().start, 0);
        assert!(tiny.windows(2).all(|w| w[0].start == w[1].end));
    }

    #[test]
    fn a_stages_buckets_cover_its_part_counted_from_its_start() {
        let layout = crate::models::cnn::cnn_layout();
        let fc1 = layout.range("fc1.weight").unwrap();
        let head = fc1.start..layout.len();
        let tiny = plan_buckets(layout, head.clone(), 1e-6);
        assert_eq!(tiny.len(), 4, "fc1 and fc2, weights and biases");
        assert_eq!(tiny.first().unwrap().end, head.len());
        assert_eq!(tiny.last().unwrap(), &(0..fc1.len()));
        assert!(tiny.windows(2).all(|w| w[0].start == w[1].end));
        let features = 0..fc1.start;
        assert_eq!(plan_buckets(layout, features.clone(), 25.0), vec![features]);
    }

    #[test]
    fn the_queue_launches_buckets_as_backward_reaches_them() {
        let mut queue = BucketQueue::new(vec![80..100, 30..80, 0..30]);
        assert_eq!(queue.next_ready(90), None, "bucket 0 is not final yet");
        assert_eq!(queue.next_ready(50), Some((0, 80..100)));
        assert_eq!(queue.next_ready(50), None);
        let err = queue.end_step().unwrap_err();
        assert!(err.to_string().contains("1 of 3"), "{err}");
        // A new step starts from the first bucket again.
        assert_eq!(queue.next_ready(0), Some((0, 80..100)));
        assert_eq!(queue.next_ready(0), Some((1, 30..80)));
        assert_eq!(queue.next_ready(0), Some((2, 0..30)));
        assert_eq!(queue.next_ready(0), None);
        queue.end_step().unwrap();
    }
}
