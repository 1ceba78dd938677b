//! FashionMNIST, resident on the training device: uploaded once as raw bytes
//! (47 MB for the training split), batches gathered on the device by index.

use anyhow::Context;
use core_tensor::Ops;
use fashion_mnist::{PIXELS, Split};

use super::Activations;
use crate::data::{Batches, EpochPlan, Order, to_device_indices};

/// One split of FashionMNIST on a device.
#[derive(Debug)]
pub struct DeviceSplit<B: Ops> {
    images: B::Storage<u8>,
    labels: B::Storage<u8>,
    len: usize,
    /// The epoch started last, and its indices on the device.
    plan: EpochPlan,
    indices: Option<B::Storage<u32>>,
}

impl<B: Ops> DeviceSplit<B> {
    pub fn upload(backend: &B, split: &Split, what: &str) -> anyhow::Result<Self> {
        Ok(Self {
            images: backend
                .upload(&split.images)
                .with_context(|| format!("uploading the {what} images"))?,
            labels: backend
                .upload(&split.labels)
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
