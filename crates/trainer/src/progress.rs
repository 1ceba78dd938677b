//! What rank 0 shows while an epoch runs: on a terminal a bar with the
//! running loss and img/s; in a file (a SLURM log) one line every few
//! seconds instead of one per step. The running numbers also go to
//! TensorBoard.

use std::cell::RefCell;
use std::io::IsTerminal;
use std::rc::Rc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::tensorboard::EventWriter;
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
    done: usize,
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
            started: Instant::now(),
            last_line: Instant::now(),
            last: None,
        }
    }

    /// "loss 0.4321, acc 0.8412, 2345 img/s", or steps/s before the first
    /// running numbers (and on a GPU, which has none).
    fn numbers(&self) -> String {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-9);
        match &self.last {
            Some(r) => format!(
                "loss {:.4}, acc {:.4}, {:.0} img/s",
                r.loss,
                r.accuracy,
                r.images as f64 / seconds
            ),
            None => format!("{:.1} steps/s", self.done as f64 / seconds),
        }
    }
}

impl Progress for Console {
    fn start_epoch(&mut self, epoch: usize, steps: usize) {
        (self.epoch, self.steps, self.done, self.last) = (epoch, steps, 0, None);
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
            tell!(
                "epoch {} step {}/{}: {}",
                self.epoch,
                self.done,
                self.steps,
                self.numbers()
            );
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
