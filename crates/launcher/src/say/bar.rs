//! A live bar on the terminal's last line, below the lines `say!` and
//! `tell!` write: rank 0's epoch, drawn by the launcher from its records
//! (`contract::progress`) or by a process that trains itself. indicatif
//! draws it: a line written while the bar shows is written with the bar
//! suspended (cleared, the line out, the bar drawn again under it), so the
//! lines scroll above the bar, and its target draws nothing when stderr is
//! no terminal. One bar per process (the terminal has one last line); every
//! line and draw takes its lock, so threads never cut into each other's.

use std::io::{self, IsTerminal};
use std::sync::{Mutex, MutexGuard, PoisonError};

use indicatif::{HumanDuration, ProgressBar, ProgressDrawTarget, ProgressState, ProgressStyle};

/// `epoch 1 [=======>      ] 412/938 eta 21s | loss 0.6012, ...`, the
/// line as wide as the terminal: the bar takes what the rest leaves.
const TEMPLATE: &str = "epoch {prefix} [{wide_bar}] {pos}/{len} eta {left} | {msg}";

/// The bar of one epoch.
struct Shown {
    epoch: usize,
    bar: ProgressBar,
}

static BAR: Mutex<Option<Shown>> = Mutex::new(None);

fn bar() -> MutexGuard<'static, Option<Shown>> {
    BAR.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a bar can be drawn: stderr is a terminal.
pub fn available() -> bool {
    io::stderr().is_terminal()
}

/// Shows `epoch` at `step` of `steps` with `note`, replacing the bar
/// drawn last (a new epoch starts its rate afresh).
pub fn show(epoch: usize, steps: (u64, u64), note: &str) {
    update(&mut bar(), epoch, steps, note, ProgressDrawTarget::stderr);
}

/// Takes the bar off the terminal.
pub fn hide() {
    if let Some(shown) = bar().take() {
        shown.bar.finish_and_clear();
    }
}

/// Runs `write` (a line to stdout or stderr) above the bar.
pub(super) fn above(write: impl FnOnce()) {
    above_bar(&bar(), write);
}

fn above_bar(shown: &Option<Shown>, write: impl FnOnce()) {
    match shown {
        Some(shown) => shown.bar.suspend(write),
        None => write(),
    }
}

/// [`show`] on `shown`: the same epoch moves its bar, another one (or
/// another length) gets a new bar drawn on `target`.
fn update(
    shown: &mut Option<Shown>,
    epoch: usize,
    (step, steps): (u64, u64),
    note: &str,
    target: impl FnOnce() -> ProgressDrawTarget,
) {
    if let Some(s) = shown
        .as_ref()
        .filter(|s| s.epoch == epoch && s.bar.length() == Some(steps))
    {
        // indicatif's rate starts afresh when the step goes back (a restart).
        s.bar.set_message(note.to_string());
        s.bar.set_position(step);
        return;
    }
    if let Some(old) = shown.take() {
        old.bar.finish_and_clear();
    }
    let bar = ProgressBar::with_draw_target(Some(steps), ProgressDrawTarget::hidden())
        .with_style(style())
        .with_prefix(epoch.to_string())
        .with_message(note.to_string())
        .with_position(step);
    // The rate behind the ETA counts from this first record on (a resumed
    // epoch starts past step 0): recorded unseen, the rate forgotten, then
    // drawn.
    bar.tick();
    bar.reset_eta();
    bar.set_draw_target(target());
    bar.tick();
    *shown = Some(Shown { epoch, bar });
}

fn style() -> ProgressStyle {
    ProgressStyle::with_template(TEMPLATE)
        .expect("the bar's template is valid")
        .progress_chars("=> ")
        .with_key("left", time_left)
}

/// `21s`, `2m`, `1h` left; `-` before a rate is known (indicatif's own
/// `{eta}` says `0s` then).
fn time_left(state: &ProgressState, out: &mut dyn std::fmt::Write) {
    let _ = match state.len() {
        Some(len) if state.pos() >= len => out.write_str("0s"),
        _ if state.per_sec() > 0.0 => write!(out, "{:#}", HumanDuration(state.eta())),
        _ => out.write_str("-"),
    };
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use indicatif::TermLike;

    use super::*;

    const NOTE: &str = "loss 0.5000, acc 0.7500, 1500 img/s";

    /// A terminal of `width` columns that keeps what is written to it,
    /// `\x00` where a line is cleared.
    #[derive(Clone, Debug)]
    struct Screen {
        width: u16,
        written: Arc<Mutex<String>>,
    }

    impl Screen {
        fn new(width: u16) -> Self {
            Screen {
                width,
                written: Arc::default(),
            }
        }

        fn push(&self, s: &str) {
            self.written.lock().unwrap().push_str(s);
        }

        fn written(&self) -> String {
            self.written.lock().unwrap().clone()
        }

        /// What the last line shows: the text since it was last cleared.
        fn last_line(&self) -> String {
            let written = self.written();
            let line = written.rsplit('\0').next().unwrap_or_default();
            line.trim_end().to_string()
        }

        fn target(&self) -> ProgressDrawTarget {
            ProgressDrawTarget::term_like(Box::new(self.clone()))
        }
    }

    impl TermLike for Screen {
        fn width(&self) -> u16 {
            self.width
        }
        fn move_cursor_up(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_down(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_right(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn move_cursor_left(&self, _: usize) -> io::Result<()> {
            Ok(())
        }
        fn write_line(&self, s: &str) -> io::Result<()> {
            self.push(s);
            self.push("\n");
            Ok(())
        }
        fn write_str(&self, s: &str) -> io::Result<()> {
            self.push(s);
            Ok(())
        }
        fn clear_line(&self) -> io::Result<()> {
            self.push("\0");
            Ok(())
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_the_step_the_time_left_and_the_note() {
        // 62 columns of text, 30 of bar.
        let screen = Screen::new(92);
        let mut shown = None;
        // Resumed at step 160: no rate yet, whatever indicatif saw of the
        // 160 steps before.
        update(&mut shown, 1, (160, 400), NOTE, || screen.target());
        assert_eq!(
            screen.last_line(),
            format!("epoch 1 [============>                 ] 160/400 eta - | {NOTE}")
        );
        update(&mut shown, 1, (400, 400), "done", || {
            unreachable!("the same bar")
        });
        shown.as_ref().unwrap().bar.tick();
        assert_eq!(
            screen.last_line(),
            format!("epoch 1 [{}] 400/400 eta 0s | done", "=".repeat(60))
        );
        // A new epoch replaces the bar.
        let next = Screen::new(92);
        update(&mut shown, 2, (0, 400), NOTE, || next.target());
        assert!(screen.written().ends_with('\0'), "the old bar was cleared");
        assert_eq!(
            next.last_line(),
            format!("epoch 2 [{}] 0/400 eta - | {NOTE}", " ".repeat(32))
        );
    }

    #[test]
    fn on_a_narrow_terminal_the_bar_narrows_and_the_note_stays() {
        let screen = Screen::new(70);
        let mut shown = None;
        update(&mut shown, 1, (200, 400), NOTE, || screen.target());
        assert_eq!(
            screen.last_line(),
            format!("epoch 1 [====>   ] 200/400 eta - | {NOTE}")
        );
    }

    #[test]
    fn lines_scroll_above_the_bar_and_it_goes_when_hidden() {
        let screen = Screen::new(200);
        let mut shown = None;
        update(&mut shown, 3, (10, 400), NOTE, || screen.target());
        let before = screen.written().len();
        above_bar(&shown, || screen.push("[rank 1] a line\n"));
        let after = screen.written()[before..].to_string();
        // Cleared, the line, the bar again under it.
        let line_at = after.find("[rank 1] a line\n").expect("the line went out");
        let bar_at = after.rfind("epoch 3 [").expect("the bar was drawn again");
        assert!(
            after[..line_at].contains('\0') && bar_at > line_at,
            "{after:?}"
        );
        shown.take().unwrap().bar.finish_and_clear();
        assert_eq!(screen.last_line(), "", "the bar is gone");
    }
}
