//! Where a step's time goes, per phase, on the host clock. On a CPU the
//! phases are the work itself; on a GPU they are the time the host spends
//! queueing it (device time needs CUDA events, read once per epoch).

use std::time::Instant;

/// The phases of a training step, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Gathering the batch.
    Data,
    /// Forward pass and loss.
    Forward,
    /// Backward pass, launching each bucket's averaging on the way.
    Backward,
    /// Waiting for the averaged gradients.
    AllReduceWait,
    /// The finiteness guard and Adam.
    Optimizer,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Data,
        Phase::Forward,
        Phase::Backward,
        Phase::AllReduceWait,
        Phase::Optimizer,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::AllReduceWait => "allreduce_wait",
            Phase::Optimizer => "optimizer",
        }
    }
}

/// Seconds per phase, summed over an epoch's steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseSeconds(pub [f64; 5]);

impl PhaseSeconds {
    pub fn get(&self, phase: Phase) -> f64 {
        self.0[phase as usize]
    }
}

/// Splits each step's wall time among its phases.
#[derive(Default)]
pub(super) struct StepTimer {
    current: Option<(Phase, Instant)>,
    totals: PhaseSeconds,
}

impl StepTimer {
    /// Ends the running phase (if any) and starts `phase`.
    pub fn enter(&mut self, phase: Phase) {
        let now = Instant::now();
        self.close(now);
        self.current = Some((phase, now));
    }

    /// Ends the step's last phase.
    pub fn end_step(&mut self) {
        self.close(Instant::now());
        self.current = None;
    }

    /// The epoch's totals so far, and a fresh start for the next epoch.
    pub fn take(&mut self) -> PhaseSeconds {
        std::mem::take(&mut self.totals)
    }

    fn close(&mut self, now: Instant) {
        if let Some((phase, since)) = self.current {
            self.totals.0[phase as usize] += (now - since).as_secs_f64();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_split_the_step_and_reset_per_epoch() {
        let mut timer = StepTimer::default();
        timer.enter(Phase::Forward);
        std::thread::sleep(std::time::Duration::from_millis(20));
        timer.enter(Phase::Optimizer);
        timer.end_step();
        let totals = timer.take();
        assert!(totals.get(Phase::Forward) >= 0.02, "{totals:?}");
        assert!(totals.get(Phase::Optimizer) < totals.get(Phase::Forward));
        assert_eq!(totals.get(Phase::Data), 0.0);
        assert_eq!(timer.take(), PhaseSeconds::default());
    }
}
