//! A live bar on the terminal's last line, below the lines `say!` and
//! `tell!` write: rank 0's epoch, drawn by the launcher from its records
//! (`contract::progress`) or by a process that trains itself. A line
//! written while the bar shows clears it, goes out, and the bar is drawn
//! again under it, so the lines scroll above the bar. One bar per process
//! (the terminal has one last line); every line and draw takes its lock,
//! so threads never cut into each other's.

use std::io::{self, IsTerminal, Write};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

/// The bar's width in characters, between its brackets: the most, and
/// the least on a narrow terminal.
const MAX_WIDTH: usize = 30;
const MIN_WIDTH: usize = 10;

/// What the bar shows.
struct Bar {
    epoch: usize,
    step: u64,
    steps: u64,
    note: String,
    /// The first record of the epoch: when, and at which step (a resumed
    /// epoch starts past 0), for the rate behind the ETA.
    since: (Instant, u64),
}

static BAR: Mutex<Option<Bar>> = Mutex::new(None);

fn bar() -> MutexGuard<'static, Option<Bar>> {
    BAR.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a bar can be drawn: stderr is a terminal.
pub fn available() -> bool {
    io::stderr().is_terminal()
}

/// Shows `epoch` at `step` of `steps` with `note`, replacing the bar
/// drawn last (a new epoch starts its rate afresh).
pub fn show(epoch: usize, (step, steps): (u64, u64), note: &str) {
    let mut shown = bar();
    match shown.as_mut() {
        Some(b) if b.epoch == epoch && b.steps == steps && step >= b.since.1 => {
            b.step = step;
            b.note = note.to_string();
        }
        _ => {
            *shown = Some(Bar {
                epoch,
                step,
                steps,
                note: note.to_string(),
                since: (Instant::now(), step),
            })
        }
    }
    if let Some(b) = shown.as_ref() {
        draw(b);
    }
}

/// Takes the bar off the terminal.
pub fn hide() {
    if bar().take().is_some() {
        write_err(b"\r\x1b[K");
    }
}

/// Runs `write` (a line to stdout or stderr) above the bar.
pub(super) fn above(write: impl FnOnce()) {
    let shown = bar();
    if shown.is_some() {
        write_err(b"\r\x1b[K");
    }
    write();
    if let Some(b) = shown.as_ref() {
        draw(b);
    }
}

fn draw(b: &Bar) {
    let text = render(b, b.since.0.elapsed().as_secs_f64(), columns() - 1);
    write_err(format!("\r{text}\x1b[K").as_bytes());
}

fn write_err(bytes: &[u8]) {
    let mut err = io::stderr().lock();
    let _ = err.write_all(bytes).and_then(|()| err.flush());
}

/// `epoch 1 [=======>      ] 412/938 eta 21s | loss 0.6012, ...`, the
/// bar `seconds` after its epoch's first record, in `columns` characters
/// at the most (the bar narrows to [`MIN_WIDTH`], then the note is cut).
fn render(b: &Bar, seconds: f64, columns: usize) -> String {
    let done = b.step.saturating_sub(b.since.1);
    let eta = match (done, b.steps.saturating_sub(b.step)) {
        (_, 0) => "0s".to_string(),
        (0, _) => "-".to_string(),
        (done, left) => duration(left as f64 * seconds / done as f64),
    };
    let head = format!("epoch {} [", b.epoch);
    let tail = format!("] {}/{} eta {eta} | {}", b.step, b.steps, b.note);
    let room = columns.saturating_sub(head.chars().count() + tail.chars().count());
    let width = room.clamp(MIN_WIDTH, MAX_WIDTH);
    let filled = match b.steps {
        0 => width,
        n => (b.step.min(n) as usize * width) / n as usize,
    };
    let arrow = if filled < width { ">" } else { "" };
    let empty = width - filled - arrow.len();
    let text = format!(
        "{head}{}{arrow}{}{tail}",
        "=".repeat(filled),
        " ".repeat(empty)
    );
    text.chars().take(columns).collect()
}

/// `42s`, `2m05s`, `1h02m`.
fn duration(seconds: f64) -> String {
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// The terminal's width (80 when it does not say).
fn columns() -> usize {
    // SAFETY: TIOCGWINSZ writes a winsize into the zeroed one we own; on
    // a descriptor that is no terminal it fails and writes nothing.
    let cols = unsafe {
        let mut size: libc::winsize = std::mem::zeroed();
        match libc::ioctl(libc::STDERR_FILENO, libc::TIOCGWINSZ, &mut size) {
            0 => size.ws_col as usize,
            _ => 0,
        }
    };
    if cols == 0 { 80 } else { cols }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(step: u64, since: u64) -> Bar {
        Bar {
            epoch: 1,
            step,
            steps: 400,
            note: "loss 0.5000, acc 0.7500, 1500 img/s".into(),
            since: (Instant::now(), since),
        }
    }

    #[test]
    fn the_bar_shows_the_step_the_time_left_and_the_note() {
        // 100 steps in 10 s since a resume at step 60: 240 left, 24 s.
        assert_eq!(
            render(&at(160, 60), 10.0, 200),
            "epoch 1 [============>                 ] 160/400 eta 24s | loss 0.5000, acc 0.7500, 1500 img/s"
        );
        assert_eq!(
            render(&at(60, 60), 3.0, 80),
            "epoch 1 [==>                ] 60/400 eta - | loss 0.5000, acc 0.7500, 1500 img/s"
        );
        // A narrow terminal: the bar at its least, then the note cut.
        assert_eq!(
            render(&at(400, 0), 99.0, 60),
            "epoch 1 [==========] 400/400 eta 0s | loss 0.5000, acc 0.750"
        );
        assert_eq!(duration(125.0), "2m05s");
        assert_eq!(duration(3720.0), "1h02m");
    }
}
