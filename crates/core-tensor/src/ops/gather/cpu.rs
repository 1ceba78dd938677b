use std::ops::Range;
use std::sync::Arc;

use super::GatherKernel;
use crate::{Cpu, Error, Result};

impl GatherKernel for Cpu {
    fn gather_batch(
        &self,
        images: &Arc<Vec<u8>>,
        labels: &Arc<Vec<u8>>,
        pixels: usize,
        indices: &Vec<u32>,
        positions: Range<usize>,
        mut x: Option<&mut Vec<f32>>,
        mut y: Option<&mut Vec<u8>>,
    ) -> Result<()> {
        super::check::<Self>(
            images,
            labels,
            pixels,
            indices,
            &positions,
            x.as_deref(),
            y.as_deref(),
        )?;
        for (row, &index) in indices[positions].iter().enumerate() {
            let i = index as usize;
            // `check` matched the images to the labels: a sample with a
            // label has its pixels.
            let label = *labels.get(i).ok_or_else(|| Error::InvalidArgument {
                op: "gather_batch",
                reason: format!("sample index {i} is beyond the {} samples", labels.len()),
            })?;
            if let Some(x) = x.as_deref_mut() {
                let src = &images[i * pixels..(i + 1) * pixels];
                x[row * pixels..(row + 1) * pixels]
                    .iter_mut()
                    .zip(src)
                    .for_each(|(dst, &px)| *dst = f32::from(px) / 255.0);
            }
            if let Some(y) = y.as_deref_mut() {
                y[row] = label;
            }
        }
        Ok(())
    }
}
