//! FashionMNIST, resident on the training device: uploaded once as raw bytes
//! (47 MB for the training split), batches gathered on the device by index.
//! On the CPU nothing is uploaded: the ranks of one process (threads) read
//! one shared copy ([`HostSplit`], through [`core_tensor::Backend::share`]).

use std::sync::Arc;

use anyhow::Context;
use core_tensor::Ops;
use fashion_mnist::{PIXELS, Split};

use super::Activations;
use crate::data::{Batches, EpochPlan, Order, to_device_indices};

/// One split of FashionMNIST in host memory, read-only and
/// reference-counted, so that the ranks of one process share it.
#[derive(Clone, Debug)]
pub struct HostSplit {
    pub images: Arc<Vec<u8>>,
    pub labels: Arc<Vec<u8>>,
    pub len: usize,
}

/// Takes over the split's bytes (no copy).
impl From<Split> for HostSplit {
    fn from(split: Split) -> Self {
        Self {
            images: Arc::new(split.images),
            labels: Arc::new(split.labels),
            len: split.len,
        }
    }
}

/// One split of FashionMNIST on a device.
#[derive(Debug)]
pub struct DeviceSplit<B: Ops> {
    images: B::Shared<u8>,
    labels: B::Shared<u8>,
    len: usize,
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
            plan: EpochPlan::default(),
            indices: None,
        })
    }
}

/// Fills the CNN's activations, or any buffers holding them (a pipeline
/// stage's).
impl<B: Ops, Buf: AsMut<Activations<B>>> Batches<B, Buf> for DeviceSplit<B> {
    fn sample_count(&self) -> usize {
        self.len
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

    /// Gathers the batch's images and labels on the device.
    fn fill(&mut self, backend: &B, step: usize, buffers: &mut Buf) -> anyhow::Result<()> {
        let act = buffers.as_mut();
        let (Some(indices), Some(positions)) = (&self.indices, self.plan.batches.get(step)) else {
            anyhow::bail!("batch {step} is not in this epoch");
        };
        Ok(backend.gather_batch(
            &self.images,
            &self.labels,
            PIXELS,
            indices,
            positions.clone(),
            &mut act.x,
            &mut act.labels,
        )?)
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
}
