use super::{EmbeddingGeom, EmbeddingKernel};
use crate::{Cpu, Result};

impl EmbeddingKernel for Cpu {
    fn embedding_fwd(
        &self,
        g: &EmbeddingGeom,
        ids: &Vec<u32>,
        params: &Vec<f32>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, params, out)?;
        let table = &params[g.table()];
        for (&id, row) in ids.iter().zip(out.chunks_mut(g.dim.max(1))) {
            let at = id as usize * g.dim;
            let src = table.get(at..at + g.dim).ok_or_else(|| g.bad_id(id))?;
            row.copy_from_slice(src);
        }
        Ok(())
    }

    fn embedding_bwd(
        &self,
        g: &EmbeddingGeom,
        ids: &Vec<u32>,
        dout: &Vec<f32>,
        grads: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, grads, dout)?;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= g.rows) {
            return Err(g.bad_id(id));
        }
        grads[g.table()].fill(0.0);
        self.embedding_bwd_add(g, ids, dout, grads)
    }

    fn embedding_bwd_add(
        &self,
        g: &EmbeddingGeom,
        ids: &Vec<u32>,
        dout: &Vec<f32>,
        grads: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, grads, dout)?;
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= g.rows) {
            return Err(g.bad_id(id));
        }
        let table = &mut grads[g.table()];
        for (&id, row) in ids.iter().zip(dout.chunks(g.dim.max(1))) {
            let at = id as usize * g.dim;
            for (t, &d) in table[at..at + g.dim].iter_mut().zip(row) {
                *t += d;
            }
        }
        Ok(())
    }
}
