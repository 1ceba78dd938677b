//! Where a step's time goes, per phase, in device time: the work itself on
//! a CPU, CUDA events on the compute stream on a GPU (read when the host
//! synchronises anyway: every few steps and once per epoch).

use core_tensor::Backend;

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
    /// A pipeline stage idle inside its schedule, waiting for the other
    /// stage (sending to it or receiving from it): time the stage's own
    /// work did not take. Last, so older rows' slots keep their places.
    PipelineWait,
}

impl Phase {
    pub const ALL: [Phase; 6] = [
        Phase::Data,
        Phase::Forward,
        Phase::Backward,
        Phase::AllReduceWait,
        Phase::Optimizer,
        Phase::PipelineWait,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Data => "data",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::AllReduceWait => "allreduce_wait",
            Phase::Optimizer => "optimizer",
            Phase::PipelineWait => "pipeline_wait",
        }
    }
}

/// Seconds per phase, summed over an epoch's steps.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseSeconds(pub [f64; 6]);

impl PhaseSeconds {
    pub fn get(&self, phase: Phase) -> f64 {
        self.0[phase as usize]
    }
}

/// Splits each step's time among its phases, in device time: a mark is
/// recorded on the backend at each phase boundary (host clock on the CPU, an
/// event on the GPU's compute stream, so timing adds no synchronisation) and
/// marks are read only when the caller knows the device has caught up.
pub struct StepTimer<B: Backend> {
    backend: B,
    /// Marks recorded since the last harvest, kept to be recorded again.
    marks: Vec<B::Mark>,
    /// The phase each mark starts; `None` ends a step.
    starts: Vec<Option<Phase>>,
    recorded: usize,
    totals: PhaseSeconds,
}

impl<B: Backend> StepTimer<B> {
    pub fn new(backend: B) -> Self {
        Self {
            backend,
            marks: Vec::new(),
            starts: Vec::new(),
            recorded: 0,
            totals: PhaseSeconds::default(),
        }
    }

    /// Ends the running phase (if any) and starts `phase`.
    pub fn enter(&mut self, phase: Phase) -> core_tensor::Result<()> {
        self.record(Some(phase))
    }

    /// Ends the step's last phase.
    pub fn end_step(&mut self) -> core_tensor::Result<()> {
        self.record(None)
    }

    /// Adds the finished steps' phases to the totals. Between steps only;
    /// waits for the device to reach the last mark, so call it where the
    /// host has just synchronised (the guard read, the end of an epoch).
    pub fn harvest(&mut self) -> core_tensor::Result<()> {
        debug_assert!(self.recorded == 0 || self.starts[self.recorded - 1].is_none());
        for i in 1..self.recorded {
            if let Some(phase) = self.starts[i - 1] {
                let seconds = self
                    .backend
                    .seconds_between(&self.marks[i - 1], &self.marks[i])?;
                self.totals.0[phase as usize] += seconds;
            }
        }
        self.recorded = 0;
        Ok(())
    }

    /// The epoch's totals, and a fresh start for the next epoch.
    pub fn take(&mut self) -> core_tensor::Result<PhaseSeconds> {
        self.harvest()?;
        Ok(std::mem::take(&mut self.totals))
    }

    fn record(&mut self, starts: Option<Phase>) -> core_tensor::Result<()> {
        match self.marks.get_mut(self.recorded) {
            Some(mark) => {
                self.backend.record_mark(mark)?;
                self.starts[self.recorded] = starts;
            }
            None => {
                self.marks.push(self.backend.mark()?);
                self.starts.push(starts);
            }
        }
        self.recorded += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use core_tensor::Cpu;

    use super::*;

    #[test]
    fn phases_split_the_step_and_reset_per_epoch() {
        let mut timer = StepTimer::new(Cpu::new(1).unwrap());
        timer.enter(Phase::Forward).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        timer.enter(Phase::Optimizer).unwrap();
        timer.end_step().unwrap();
        timer.harvest().unwrap();
        // A second step reuses the first one's marks.
        timer.enter(Phase::Data).unwrap();
        timer.end_step().unwrap();
        let totals = timer.take().unwrap();
        assert!(totals.get(Phase::Forward) >= 0.02, "{totals:?}");
        assert!(totals.get(Phase::Optimizer) < totals.get(Phase::Forward));
        assert!(totals.get(Phase::Data) < totals.get(Phase::Forward));
        assert_eq!(totals.get(Phase::Backward), 0.0);
        assert_eq!(timer.marks.len(), 3);
        assert_eq!(timer.take().unwrap(), PhaseSeconds::default());
    }
}
