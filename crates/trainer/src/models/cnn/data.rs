//! FashionMNIST, resident on the training device: uploaded once as raw bytes
//! (47 MB for the training split), batches gathered on the device by index.
//! On the CPU nothing is uploaded: the ranks of one process (threads) read
//! one shared copy ([`HostSplit`], through [`core_tensor::Backend::share`]).

use std::sync::Arc;

use anyhow::Context;
use core_tensor::Ops;
use fashion_mnist::{COLS, PIXELS, ROWS, Split};

use crate::data::{Batches, DataFingerprint, EpochPlan, Hasher, Order, to_device_indices};
use crate::model::layered::{BatchInputs, stretches};

/// One split of FashionMNIST in host memory, read-only and
/// reference-counted, so that the ranks of one process share it.
#[derive(Clone, Debug)]
pub struct HostSplit {
    pub images: Arc<Vec<u8>>,
    pub labels: Arc<Vec<u8>>,
    pub len: usize,
    /// Computed once here, on the host: a GPU's copy is out of reach.
    pub fingerprint: DataFingerprint,
}

/// Takes over the split's bytes (no copy).
impl From<Split> for HostSplit {
    fn from(split: Split) -> Self {
        let fingerprint = fingerprint(&split);
        Self {
            images: Arc::new(split.images),
            labels: Arc::new(split.labels),
            len: split.len,
            fingerprint,
        }
    }
}

/// The split as loaded, every byte: its shape, labels and pixels (47 MB
/// for the training split, about 5 ms; see [`crate::data::Hasher`]).
fn fingerprint(split: &Split) -> DataFingerprint {
    let mut h = Hasher::new();
    for dim in [split.len, ROWS, COLS] {
        h.write_u64(dim as u64);
    }
    h.write(&split.labels);
    h.write(&split.images);
    h.finish(split.len as u64)
}

/// One split of FashionMNIST on a device.
#[derive(Debug)]
pub struct DeviceSplit<B: Ops> {
    images: B::Shared<u8>,
    labels: B::Shared<u8>,
    len: usize,
    fingerprint: DataFingerprint,
    /// The epoch started last, and its indices on the device.
    plan: EpochPlan,
    indices: Option<B::Storage<u32>>,
}

impl<B: Ops> DeviceSplit<B> {
    /// `split` on `backend`'s device: the same bytes on the CPU, a copy on
    /// a GPU.
    pub fn upload(backend: &B, split: &HostSplit, what: &str) -> anyhow::Result<Self> {
        Ok(Self {
            images: backend
                .share(&split.images)
                .with_context(|| format!("uploading the {what} images"))?,
            labels: backend
                .share(&split.labels)
                .with_context(|| format!("uploading the {what} labels"))?,
            len: split.len,
            fingerprint: split.fingerprint,
            plan: EpochPlan::default(),
            indices: None,
        })
    }
}

/// Fills the CNN's activations, or any buffers holding its inputs (a
/// pipeline stage's).
impl<B: Ops, Buf: BatchInputs<B, u8>> Batches<B, Buf> for DeviceSplit<B> {
    fn sample_count(&self) -> usize {
        self.len
    }

    fn fingerprint(&self) -> DataFingerprint {
        self.fingerprint
    }

    fn start_epoch(
        &mut self,
        backend: &B,
        order: &Order,
        epoch: u64,
        batch: usize,
    ) -> anyhow::Result<Vec<usize>> {
        self.plan = order.plan(self.len, epoch, batch)?;
        self.indices = if self.plan.indices.is_empty() {
            None
        } else {
            Some(to_device_indices(backend, &self.plan.indices)?)
        };
        Ok(self.plan.sizes())
    }

    /// Gathers the batch's images and labels on the device, each part's
    /// from its stretch of the batch.
    fn fill(&mut self, backend: &B, step: usize, buffers: &mut Buf) -> anyhow::Result<()> {
        let (Some(indices), Some(positions)) = (&self.indices, self.plan.batches.get(step)) else {
            anyhow::bail!("batch {step} is not in this epoch");
        };
        for (stretch, part) in stretches(buffers, step, positions.clone())? {
            backend.gather_batch(
                &self.images,
                &self.labels,
                PIXELS,
                indices,
                stretch,
                part.inputs,
                part.targets,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core_tensor::Cpu;

    /// What `--spawn threads` relies on: CPU ranks of one process (each its
    /// own backend) gather from one allocation of the data set.
    #[test]
    fn cpu_ranks_share_one_copy_of_a_split() {
        let split = Split {
            images: vec![3; 2 * PIXELS],
            labels: vec![1, 2],
            len: 2,
        };
        let host = HostSplit::from(split);
        let ranks: Vec<DeviceSplit<Cpu>> = (0..2)
            .map(|_| DeviceSplit::upload(&Cpu::new(1).unwrap(), &host, "training").unwrap())
            .collect();
        for rank in &ranks {
            assert!(Arc::ptr_eq(&rank.images, &host.images));
            assert!(Arc::ptr_eq(&rank.labels, &host.labels));
        }
        assert_eq!(Arc::strong_count(&host.images), 3);
    }

    /// The fingerprint is the data as loaded: the same on every load of the
    /// same files, another for one label or one pixel changed on disk.
    #[test]
    fn one_label_or_one_pixel_changes_the_fingerprint() {
        use fashion_mnist::{FashionMnist, Layout, TRAIN_IMAGES, TRAIN_LABELS, synth};
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout {
            train_len: 300,
            test_len: 20,
        };
        synth::write_dataset(dir.path(), layout).unwrap();
        let load = || {
            let data = FashionMnist::load_with(dir.path(), layout).unwrap();
            HostSplit::from(data.train).fingerprint
        };
        let first = load();
        assert_eq!(load(), first);
        assert_eq!(first.samples, 300);
        let labels = synth::labels_idx(300);
        let mut relabelled = labels.clone();
        *relabelled.last_mut().unwrap() ^= 1;
        synth::write_gz(&dir.path().join(TRAIN_LABELS), &relabelled).unwrap();
        let one_label = load();
        assert_ne!(one_label, first);
        synth::write_gz(&dir.path().join(TRAIN_LABELS), &labels).unwrap();
        let mut images = synth::images_idx(300);
        // Past the 16-byte header: image 137, pixel 400.
        images[16 + 137 * PIXELS + 400] ^= 1;
        synth::write_gz(&dir.path().join(TRAIN_IMAGES), &images).unwrap();
        let one_pixel = load();
        assert_ne!(one_pixel, first);
        assert_ne!(one_pixel, one_label);
        assert_eq!(one_pixel.samples, 300);
    }
}
