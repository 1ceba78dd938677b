//! Some rows of a table inside a flat buffer, picked by a list of ids in
//! increasing order: copied out into compact rows (`rows_gather`) and
//! written back from them (`rows_scatter`), the other rows left as they
//! are. What a row-sparse gradient exchange moves between the device and
//! the host: the rows a step touched, not the table. Each id names one row
//! once, so the scatter writes every element at most once and needs no
//! order between threads. The id and row buffers may be longer than
//! `count` (scratch sized for the most rows a caller moves).

mod cpu;
pub(super) mod cuda;
#[cfg(test)]
mod tests;

use crate::{Backend, Error, Result};

/// `count` ids into a table of `rows` rows of `dim` values that starts at
/// `offset` in a flat buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct RowsGeom {
    pub count: usize,
    pub dim: usize,
    pub rows: usize,
    pub offset: usize,
}

impl RowsGeom {
    /// The table's range in the flat buffer.
    pub fn table(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.rows * self.dim
    }

    /// Checks that `ids` and `compact` hold at least `count` ids and rows
    /// and that the table lies inside `flat`.
    pub(crate) fn check<B: Backend>(
        &self,
        ids: &B::Storage<u32>,
        flat: &B::Storage<f32>,
        compact: &B::Storage<f32>,
    ) -> Result<()> {
        self.check_table(
            "rows",
            B::len(ids),
            B::len(flat),
            "elements of the flat buffer",
        )?;
        if B::len(compact) < self.count * self.dim {
            return Err(Error::InvalidArgument {
                op: "rows",
                reason: format!(
                    "rows holds {} elements, fewer than the {} needed",
                    B::len(compact),
                    self.count * self.dim
                ),
            });
        }
        Ok(())
    }

    /// Checks, for `op`, that `ids_len` ids cover `count` and that the table
    /// lies inside the `len` `elements` (named so in the error) it indexes.
    pub(crate) fn check_table(
        &self,
        op: &'static str,
        ids_len: usize,
        len: usize,
        elements: &str,
    ) -> Result<()> {
        let reason = if ids_len < self.count {
            format!(
                "ids holds {ids_len} ids, fewer than the {} rows",
                self.count
            )
        } else if self.table().end > len {
            format!(
                "the table {:?} is not inside the {len} {elements}",
                self.table()
            )
        } else {
            return Ok(());
        };
        Err(Error::InvalidArgument { op, reason })
    }

    /// The first of `ids` (the first `count`) not below `rows` or not above
    /// the one before it, as an error (the CPU's; a GPU sets its fault
    /// word instead).
    pub(crate) fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let mut last = None;
        for (at, &id) in ids[..self.count].iter().enumerate() {
            let reason = if id as usize >= self.rows {
                format!(
                    "id {id} (at {at}) is not below the table's {} rows",
                    self.rows
                )
            } else if last.is_some_and(|last| last >= id) {
                format!("ids must increase: {} then {id} at {at}", last.unwrap_or(0))
            } else {
                last = Some(id);
                continue;
            };
            return Err(Error::InvalidArgument { op: "rows", reason });
        }
        Ok(())
    }
}

/// Row gather and scatter kernels.
pub trait RowsKernel: Backend {
    /// `rows[b] = flat[table][ids[b]]` for `b < count`: one row of `dim`
    /// each, side by side; the rest of `rows` is left as it is.
    fn rows_gather(
        &self,
        geom: &RowsGeom,
        ids: &Self::Storage<u32>,
        flat: &Self::Storage<f32>,
        rows: &mut Self::Storage<f32>,
    ) -> Result<()>;

    /// `flat[table][ids[b]] = rows[b]` for `b < count`; every other element
    /// of `flat` is left as it is.
    fn rows_scatter(
        &self,
        geom: &RowsGeom,
        ids: &Self::Storage<u32>,
        rows: &Self::Storage<f32>,
        flat: &mut Self::Storage<f32>,
    ) -> Result<()>;
}
