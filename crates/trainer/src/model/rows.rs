//! A model's row tables: tables of rows that a batch's ids look up
//! (recsys' embedding and its per-row biases), whose gradient is `+0.0`
//! but for the rows the batch looked up. The sparse gradient exchange
//! moves only those rows, `--sparse-adam` updates only them, and the
//! finiteness guard reads only them.

use std::ops::Range;

use core_tensor::ops::RowsGeom;

/// The capability a model with row tables offers
/// ([`super::Model::row_tables`]); `Buf` is its buffers.
pub trait RowTables<Buf> {
    /// Every table (range and row width) the batch's ids index, as
    /// PyTorch would hold each in an `nn.Embedding(sparse=True)`: the same
    /// ids index all of them, so they have as many rows each. Backward
    /// writes `+0.0` to every row the batch did not look up.
    fn tables(&self) -> Vec<(Range<usize>, usize)>;

    /// The rows the batch last filled into `buffers` looks up, increasing,
    /// each once.
    fn rows<'a>(&self, buffers: &'a Buf) -> &'a [u32];

    /// Whether backward adds the batch's rows into the tables' gradient
    /// (which the trainer must then keep all `+0.0` whenever backward
    /// begins, as `--sparse-adam`'s lazy step does) instead of overwriting
    /// the whole tables.
    fn adds_into_zeroed_tables(&self) -> bool;
}

/// The geometry of a row table: `range` holds rows of `width` floats (0
/// counts as 1), no rows picked yet (`count` 0).
pub fn row_table_geom(range: &Range<usize>, width: usize) -> RowsGeom {
    let dim = width.max(1);
    RowsGeom {
        count: 0,
        dim,
        rows: range.len() / dim,
        offset: range.start,
    }
}

/// Rows of device scratch for `count` rows of tables of `rows` rows: grown
/// in powers of two (so a step that uses a few more rows than the last does
/// not reallocate), never past the tables' rows, never below `count`.
pub fn row_room(count: usize, rows: usize) -> usize {
    count.next_power_of_two().min(rows).max(count)
}
