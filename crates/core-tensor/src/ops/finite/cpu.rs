use super::{FiniteKernel, check};
use crate::{Cpu, Result};

impl FiniteKernel for Cpu {
    fn guard_finite(
        &self,
        step: u32,
        loss: &Vec<f32>,
        values: &Vec<f32>,
        guard: &mut Vec<u32>,
    ) -> Result<()> {
        check(step, loss.len(), values.len(), guard.len())?;
        if guard[0] != 0 {
            return Ok(());
        }
        // A branch-free fold the compiler vectorizes; the search for the
        // first bad element only runs when there is one.
        let any_bad = values.iter().fold(false, |bad, v| bad | !v.is_finite());
        let first_bad = if any_bad {
            values.iter().position(|v| !v.is_finite())
        } else {
            None
        };
        if first_bad.is_some() || !loss[0].is_finite() {
            guard[0] = step;
            // `check` bounded the length by u32.
            guard[1] = first_bad.map_or(u32::MAX, |i| i as u32);
        }
        Ok(())
    }
}
