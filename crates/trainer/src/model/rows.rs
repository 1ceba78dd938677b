//! The geometry of a model's row tables (see [`super::Model::row_tables`]):
//! what the sparse gradient exchange and `--sparse-adam` move.

use std::ops::Range;

use core_tensor::ops::RowsGeom;

/// The geometry of a table of [`Model::row_tables`](super::Model::row_tables): `range` holds rows of
/// `width` floats (0 counts as 1), no rows picked yet (`count` 0).
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
