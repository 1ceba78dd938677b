use super::{OffsetGeom, OffsetKernel};
use crate::{Cpu, Result};

impl OffsetKernel for Cpu {
    fn offset_fwd(&self, g: &OffsetGeom, offsets: &Vec<f32>, y: &mut Vec<f32>) -> Result<()> {
        g.check::<Self>(offsets, y)?;
        if g.k == 0 {
            return Ok(());
        }
        for (y, o) in y.iter_mut().zip(offsets.chunks(g.k)) {
            for &o in o {
                *y += o;
            }
        }
        Ok(())
    }

    fn offset_bwd(&self, g: &OffsetGeom, dy: &Vec<f32>, d_offsets: &mut Vec<f32>) -> Result<()> {
        g.check::<Self>(d_offsets, dy)?;
        if g.k == 0 {
            return Ok(());
        }
        for (&dy, d) in dy.iter().zip(d_offsets.chunks_mut(g.k)) {
            d.fill(dy);
        }
        Ok(())
    }
}
