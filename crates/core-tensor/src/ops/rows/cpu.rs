use super::{RowsGeom, RowsKernel};
use crate::{Cpu, Result};

impl RowsKernel for Cpu {
    fn rows_gather(
        &self,
        g: &RowsGeom,
        ids: &Vec<u32>,
        flat: &Vec<f32>,
        rows: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, flat, rows)?;
        g.check_ids(ids)?;
        let (table, d) = (&flat[g.table()], g.dim);
        for (&id, row) in ids[..g.count].iter().zip(rows.chunks_exact_mut(d.max(1))) {
            row.copy_from_slice(&table[id as usize * d..][..d]);
        }
        Ok(())
    }

    fn rows_scatter(
        &self,
        g: &RowsGeom,
        ids: &Vec<u32>,
        rows: &Vec<f32>,
        flat: &mut Vec<f32>,
    ) -> Result<()> {
        g.check::<Self>(ids, flat, rows)?;
        g.check_ids(ids)?;
        let (table, d) = (&mut flat[g.table()], g.dim);
        for (&id, row) in ids[..g.count].iter().zip(rows.chunks_exact(d.max(1))) {
            table[id as usize * d..][..d].copy_from_slice(row);
        }
        Ok(())
    }
}
