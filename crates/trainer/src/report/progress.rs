//! What rank 0 shows while an epoch runs: on a terminal a bar with the
//! running loss and img/s; in a file (a SLURM log) one line every few
//! seconds instead of one per step. The running numbers also go to
//! TensorBoard.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::rc::Rc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::tensorboard::EventWriter;
use crate::train::{Progress, Running};

/// Rank 0's progress display.
pub struct Console {
    /// A bar on a terminal; `None` between epochs or when stderr is a file.
    bar: Option<ProgressBar>,
    terminal: bool,
    /// Seconds between lines when stderr is a file.
    line_every: Duration,
    /// Steps between running numbers.
    running_every: u64,
    board: Option<Rc<RefCell<EventWriter>>>,
    epoch: usize,
    steps: usize,
    /// Steps of the epoch done, those before a resume included.
    done: usize,
    /// Steps done when this process began the epoch (a resume point).
    first: usize,
    started: Instant,
    last_line: Instant,
    last: Option<Running>,
}

impl Console {
    pub fn new(
        running_every: u64,
        line_every: Duration,
        board: Option<Rc<RefCell<EventWriter>>>,
    ) -> Self {
        Self {
            bar: None,
            terminal: std::io::stderr().is_terminal(),
            line_every,
            running_every,
            board,
            epoch: 0,
            steps: 0,
            done: 0,
            first: 0,
            started: Instant::now(),
            last_line: Instant::now(),
            last: None,
        }
    }

    /// "loss 0.4321, acc 0.8412, 2345 img/s", or steps/s before the first
    /// running numbers (and on a GPU, which has none). The rate divides
    /// the images by the seconds counted with them: dividing by the time
    /// now would sag between two running points.
    fn numbers(&self) -> String {
        match &self.last {
            Some(r) => format!(
                "loss {:.4}, acc {:.4}, {:.0} img/s",
                r.loss,
                r.accuracy,
                r.images as f64 / r.train_seconds.max(1e-9)
            ),
            None => {
                let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
                let steps = self.done - self.first;
                format!("{:.1} steps/s", steps as f64 / seconds)
            }
        }
    }

    /// The periodic line: the position in the epoch, not in this run.
    fn line(&self) -> String {
        format!(
            "epoch {} step {}/{}: {}",
            self.epoch,
            self.done,
            self.steps,
            self.numbers()
        )
    }
}

impl Progress for Console {
    fn start_epoch(&mut self, epoch: usize, steps: usize, done: usize) {
        (self.epoch, self.steps, self.last) = (epoch, steps, None);
        (self.done, self.first) = (done, done);
        self.started = Instant::now();
        self.last_line = self.started;
        if self.terminal {
            let bar = ProgressBar::new(steps as u64);
            if let Ok(style) = ProgressStyle::with_template(
                "epoch {prefix} [{bar:30}] {pos}/{len} | {msg} | eta {eta}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(epoch.to_string());
            bar.set_position(done as u64);
            bar.set_message(self.numbers());
            self.bar = Some(bar);
        }
    }

    fn step(&mut self) {
        self.done += 1;
        if let Some(bar) = &self.bar {
            bar.inc(1);
            bar.set_message(self.numbers());
        } else if !self.terminal && self.last_line.elapsed() >= self.line_every {
            self.last_line = Instant::now();
            tell!("{}", self.line());
        }
    }

    fn finish_epoch(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }

    fn running_every(&self) -> Option<u64> {
        Some(self.running_every)
    }

    fn running(&mut self, numbers: &Running) {
        self.last = Some(*numbers);
        if let Some(bar) = &self.bar {
            bar.set_message(self.numbers());
        }
        let Some(board) = &self.board else { return };
        let written = board.borrow_mut().scalars(
            numbers.global_step,
            &[
                ("train/loss", numbers.loss),
                ("train/accuracy", numbers.accuracy),
            ],
        );
        if let Err(e) = written {
            tell!("note: TensorBoard logging stops: {e:#}");
            self.board = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(images: u64, train_seconds: f64) -> Running {
        Running {
            global_step: 1,
            loss: 0.5,
            accuracy: 0.75,
            images,
            train_seconds,
        }
    }

    #[test]
    fn the_rate_is_taken_at_the_instant_of_the_count() {
        let mut console = Console::new(10, Duration::from_secs(3600), None);
        console.terminal = false;
        console.start_epoch(1, 400, 0);
        console.running(&running(3000, 2.0));
        // Time passing before the next count must not lower the rate.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(console.numbers(), "loss 0.5000, acc 0.7500, 1500 img/s");
    }

    #[test]
    fn a_resumed_epoch_counts_its_steps_from_the_epochs_start() {
        let mut console = Console::new(10, Duration::from_secs(3600), None);
        console.terminal = false;
        console.start_epoch(1, 400, 60);
        for _ in 0..312 {
            console.step();
        }
        // The meter's images and seconds include those before the resume.
        console.running(&running(372 * 64, 372.0 * 64.0 / 1500.0));
        assert_eq!(
            console.line(),
            "epoch 1 step 372/400: loss 0.5000, acc 0.7500, 1500 img/s"
        );
    }
}
