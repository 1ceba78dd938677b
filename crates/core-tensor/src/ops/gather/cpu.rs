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
        x: &mut Vec<f32>,
        y: &mut Vec<u8>,
    ) -> Result<()> {
        super::check::<Self>(images, labels, pixels, indices, &positions, x, y)?;
        let chosen = &indices[positions];
        for ((&index, row), label) in chosen
            .iter()
            .zip(x.chunks_mut(pixels.max(1)))
            .zip(y.iter_mut())
        {
            let i = index as usize;
            let src =
                images
                    .get(i * pixels..(i + 1) * pixels)
                    .ok_or_else(|| Error::InvalidArgument {
                        op: "gather_batch",
                        reason: format!("sample index {i} is beyond the {} samples", labels.len()),
                    })?;
            row.iter_mut()
                .zip(src)
                .for_each(|(dst, &px)| *dst = f32::from(px) / 255.0);
            *label = labels[i];
        }
        Ok(())
    }
}
