//! What rank 0 shows while an epoch runs: a bar with the running loss,
//! img/s and the time left, on the terminal's last line below the other
//! lines; in a file (a SLURM log) one line every few seconds instead of
//! one per step. Under the built-in launcher rank 0's stderr is a pipe:
//! when the launcher's own stderr is a terminal it hands rank 0 a pipe for
//! progress records (`launcher::contract::progress`) and draws the bar
//! itself; a single process, or `--spawn threads`, draws it here. The
//! running numbers also go to TensorBoard.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use launcher::contract::progress::{Position, Progress as Record, ProgressPipe};
use launcher::say::bar;

use super::tensorboard::EventWriter;
use crate::train::{Progress, Running};

/// The least time between two draws of the bar (or records to the
/// launcher), but at an epoch's start, its running numbers and its end.
const REDRAW: Duration = Duration::from_millis(100);

/// Where rank 0's progress goes.
enum Shown {
    /// Records to the launcher that draws them.
    Records(ProgressPipe),
    /// The bar on this process's terminal.
    Bar,
    /// A line every so many seconds.
    Lines(Duration),
}

/// Rank 0's progress display.
pub struct Console {
    shown: Shown,
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
    /// When the display last changed (a draw, a record or a line).
    last_shown: Instant,
    last: Option<Running>,
}

impl Console {
    /// The display for this process: records when the launcher asked for
    /// them, a bar on a terminal, else a line every `line_every`.
    pub fn new(
        running_every: u64,
        line_every: Duration,
        board: Option<Rc<RefCell<EventWriter>>>,
    ) -> Self {
        let shown = match ProgressPipe::from_env() {
            Some(pipe) => Shown::Records(pipe),
            None if bar::available() => Shown::Bar,
            None => Shown::Lines(line_every),
        };
        Self {
            shown,
            running_every,
            board,
            epoch: 0,
            steps: 0,
            done: 0,
            first: 0,
            started: Instant::now(),
            last_shown: Instant::now(),
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

    /// Shows where the epoch stands: at once if `now`, else when the last
    /// showing is old enough.
    fn show(&mut self, now: bool) {
        let due = match self.shown {
            Shown::Lines(every) => !now && self.last_shown.elapsed() >= every,
            _ => now || self.last_shown.elapsed() >= REDRAW,
        };
        if !due {
            return;
        }
        self.last_shown = Instant::now();
        let (step, steps) = (self.done as u64, self.steps as u64);
        let note = self.numbers();
        match &mut self.shown {
            Shown::Records(pipe) => {
                let at = Position {
                    epoch: self.epoch,
                    step,
                    steps,
                    note,
                };
                // The launcher is gone: the run goes on, and so do its lines.
                if pipe.send(&Record::At(at)).is_err() {
                    self.shown = Shown::Lines(Duration::from_secs(30));
                }
            }
            Shown::Bar => bar::show(self.epoch, (step, steps), &note),
            Shown::Lines(_) => tell!("{}", self.line()),
        }
    }
}

impl Progress for Console {
    fn start_epoch(&mut self, epoch: usize, steps: usize, done: usize) {
        (self.epoch, self.steps, self.last) = (epoch, steps, None);
        (self.done, self.first) = (done, done);
        self.started = Instant::now();
        self.last_shown = self.started;
        self.show(true);
    }

    fn step(&mut self) {
        self.done += 1;
        self.show(self.done == self.steps && !matches!(self.shown, Shown::Lines(_)));
    }

    fn finish_epoch(&mut self) {
        match &mut self.shown {
            Shown::Records(pipe) => {
                let _ = pipe.send(&Record::Done);
            }
            Shown::Bar => bar::hide(),
            Shown::Lines(_) => {}
        }
    }

    fn running_every(&self) -> Option<u64> {
        Some(self.running_every)
    }

    fn running(&mut self, numbers: &Running) {
        self.last = Some(*numbers);
        if !matches!(self.shown, Shown::Lines(_)) {
            self.show(true);
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

impl Drop for Console {
    /// A run that fails mid-epoch leaves no bar behind its error.
    fn drop(&mut self) {
        self.finish_epoch();
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

    fn console() -> Console {
        let mut console = Console::new(10, Duration::from_secs(3600), None);
        console.shown = Shown::Lines(Duration::from_secs(3600));
        console
    }

    #[test]
    fn the_rate_is_taken_at_the_instant_of_the_count() {
        let mut console = console();
        console.start_epoch(1, 400, 0);
        console.running(&running(3000, 2.0));
        // Time passing before the next count must not lower the rate.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(console.numbers(), "loss 0.5000, acc 0.7500, 1500 img/s");
    }

    #[test]
    fn a_resumed_epoch_counts_its_steps_from_the_epochs_start() {
        let mut console = console();
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
