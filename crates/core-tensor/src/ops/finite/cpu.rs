use std::ops::Range;

use super::{FiniteKernel, check_range, check_rows};
use crate::ops::RowsGeom;
use crate::{Cpu, Result};

/// The first non-finite element of `values`. A branch-free fold the
/// compiler vectorizes; the search for the element only runs when there
/// is one.
fn first_bad(values: &[f32]) -> Option<usize> {
    let any_bad = values.iter().fold(false, |bad, v| bad | !v.is_finite());
    any_bad.then(|| values.iter().position(|v| !v.is_finite()))?
}

/// Whether the guard may still change at `step`: clear, or tripped at this
/// same step by an earlier call (which may have seen a larger index).
fn open_at(guard: &[u32], step: u32) -> bool {
    guard[0] == 0 || guard[0] == step
}

/// Trips the guard at `step` and lowers its index to `index`, if any.
fn trip(guard: &mut [u32], step: u32, index: Option<usize>) {
    if guard[0] == 0 {
        guard[0] = step;
    }
    if let Some(i) = index {
        // `check` bounded every index by u32.
        guard[1] = guard[1].min(i as u32);
    }
}

impl FiniteKernel for Cpu {
    fn guard_finite_range(
        &self,
        step: u32,
        loss: &Vec<f32>,
        values: &Vec<f32>,
        range: Range<usize>,
        guard: &mut Vec<u32>,
    ) -> Result<()> {
        check_range(step, loss.len(), values.len(), &range, guard.len())?;
        if !open_at(guard, step) {
            return Ok(());
        }
        let bad = first_bad(&values[range.clone()]).map(|i| range.start + i);
        if bad.is_some() || !loss[0].is_finite() {
            trip(guard, step, bad);
        }
        Ok(())
    }

    /// Row after row, in increasing order: the first bad element found is
    /// the smallest.
    fn guard_finite_rows(
        &self,
        step: u32,
        g: &RowsGeom,
        ids: &Vec<u32>,
        values: &Vec<f32>,
        guard: &mut Vec<u32>,
    ) -> Result<()> {
        check_rows(step, g, ids.len(), values.len(), guard.len())?;
        g.check_ids(ids)?;
        if !open_at(guard, step) {
            return Ok(());
        }
        for &id in &ids[..g.count] {
            let start = g.offset + id as usize * g.dim;
            if let Some(i) = first_bad(&values[start..start + g.dim]) {
                trip(guard, step, Some(start + i));
                break;
            }
        }
        Ok(())
    }
}
