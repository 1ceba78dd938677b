//! Reading the finiteness guard, and what to say when it tripped.

use anyhow::bail;
use core_tensor::Ops;
use core_tensor::ops::{GUARD_LEN, GuardState};

use super::StepEngine;
use crate::model::Model;

/// On a device whose reads synchronise, the guard is read every this many
/// steps (and at every epoch end and checkpoint).
pub(in crate::train) const GUARD_READ_EVERY: u64 = 100;

impl<B: Ops, M: Model<B>> StepEngine<B, M> {
    /// Stops once the guard saw a non-finite loss or gradient. The guard
    /// skips the Adam update of that step and every later one on the
    /// device, so the parameters (and any checkpoint) stay those from before
    /// it; this only reports it, naming the step and the parameter. The
    /// loss is the epoch's running sum: non-finite from the first bad step
    /// on. With several ranks the gradients are already averaged, so every
    /// rank stops at the same step.
    ///
    /// Reading the guard waits for the device, so every collective queued
    /// before has completed or been aborted by then: a failed one is
    /// reported first (the gradients it left are not to be trusted).
    pub fn check_guard(&self) -> anyhow::Result<()> {
        let mut words = [0u32; GUARD_LEN];
        self.backend
            .read_range(&self.replica.guard, 0..GUARD_LEN, &mut words)?;
        self.averaging.check()?;
        let GuardState::Tripped { step, index } = GuardState::from_words(words) else {
            return Ok(());
        };
        let what = match index {
            Some(i) => {
                let i = i + self.replica.offset();
                let views = self.model.layout().views();
                match views.iter().find(|v| v.range.contains(&i)) {
                    Some(v) => format!(
                        "gradient in {} (its element {}, flat index {i})",
                        v.spec.name,
                        i - v.range.start
                    ),
                    None => format!("gradient (flat index {i})"),
                }
            }
            None => "loss".to_string(),
        };
        if u64::from(step) == self.replica.step {
            bail!("non-finite {what}; stopped before applying this step");
        }
        bail!(
            "non-finite {what} at optimizer step {step} (noticed at step {}); that update and \
             every one after it were skipped, so the parameters are those from before it",
            self.replica.step
        );
    }
}
