//! Lines for the user that never take the process down: `println!` and
//! `eprintln!` panic when their reader is gone (a `| head` that exited, a
//! `tee` or an ssh session that died, a launcher killed under its workers),
//! which would end a training that nothing else stops. These drop the line
//! instead; the run goes on and its checkpoints and metrics file still tell
//! (a stdout failing for another reason, a full disk, is said once).
//!
//! Each line leaves in one write: `writeln!` on stderr writes its pieces
//! one call each, and the launcher's threads relaying several workers'
//! stdout and stderr into one file (SLURM's default, or `2>&1`) then mixed
//! one line's prefix into another's text. On a terminal the lines scroll
//! above a live progress bar when one shows ([`bar`]).

pub mod bar;

use std::fmt;
use std::io::{self, Write};

/// `println!` that drops the line when stdout is gone.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::say::out(format_args!($($arg)*))
    };
}

/// `eprintln!` that drops the line when stderr is gone.
#[macro_export]
macro_rules! tell {
    ($($arg:tt)*) => {
        $crate::say::err(format_args!($($arg)*))
    };
}

/// [`say!`]'s line, above the bar.
pub fn out(args: fmt::Arguments<'_>) {
    bar::above(|| {
        if let Err(e) = write_line(&mut io::stdout(), args) {
            stdout_failed(&e);
        }
    });
}

/// [`tell!`]'s line, above the bar.
pub fn err(args: fmt::Arguments<'_>) {
    bar::above(|| {
        let _ = write_line(&mut io::stderr(), args);
    });
}

/// Writes `args` and a newline to `out` in one `write_all`.
pub fn write_line(out: &mut impl Write, args: fmt::Arguments<'_>) -> io::Result<()> {
    let mut line = args.to_string();
    line.push('\n');
    out.write_all(line.as_bytes())
}

/// A line to stdout was lost. A reader that is gone (EPIPE) was chosen by
/// someone; any other error (a full disk under a redirected log, EIO) would
/// make a run look quiet and well, so it is said once on stderr. Training
/// goes on either way: the checkpoints and the metrics file are what count.
pub fn stdout_failed(e: &io::Error) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if e.kind() == io::ErrorKind::BrokenPipe || WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let text = e.to_string();
    // "No space left on device (os error 28)" without the number.
    let reason = text.split(" (os error").next().unwrap_or(&text);
    let _ = write_line(
        &mut io::stderr(),
        format_args!("stdout: {reason}: epoch lines are being lost"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts the writes it is given.
    struct Calls(Vec<Vec<u8>>);

    impl Write for Calls {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.push(buf.to_vec());
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_line_is_one_write() {
        let mut out = Calls(Vec::new());
        let rank = 3;
        write_line(&mut out, format_args!("[rank {rank}] {}", "Epoch 01/05")).unwrap();
        assert_eq!(out.0, [b"[rank 3] Epoch 01/05\n".to_vec()]);
    }
}
