//! The dataset, resident on the training device: uploaded once as raw bytes
//! (47 MB for the training split), batches gathered on the device by index.

use anyhow::Context;
use core_tensor::Ops;
use fashion_mnist::{PIXELS, Split};

/// One split of FashionMNIST on a device.
#[derive(Debug)]
pub struct DeviceSplit<B: Ops> {
    pub images: B::Storage<u8>,
    pub labels: B::Storage<u8>,
    pub len: usize,
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
        })
    }

    /// Fills `x`/`y` with the samples `indices[positions]`.
    pub fn gather(
        &self,
        backend: &B,
        indices: &B::Storage<u32>,
        positions: std::ops::Range<usize>,
        x: &mut B::Storage<f32>,
        y: &mut B::Storage<u8>,
    ) -> core_tensor::Result<()> {
        backend.gather_batch(&self.images, &self.labels, PIXELS, indices, positions, x, y)
    }
}

/// Sample indices as the device wants them.
pub fn to_device_indices<B: Ops>(
    backend: &B,
    indices: &[usize],
) -> anyhow::Result<B::Storage<u32>> {
    let narrow: Vec<u32> = indices
        .iter()
        .map(|&i| u32::try_from(i))
        .collect::<Result<_, _>>()
        .context("sample index above 2³²")?;
    Ok(backend.upload(&narrow)?)
}
