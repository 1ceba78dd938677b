//! Lines for the user that never take the process down: `println!` and
//! `eprintln!` panic when their reader is gone (a `| head` that exited, a
//! `tee` or an ssh session that died, a launcher killed under its workers),
//! which would end a training that nothing else stops. These drop the line
//! instead; the run goes on and its checkpoints and metrics file still tell.

/// `println!` that drops the line when stdout is gone.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($arg)*) {
            $crate::say::stdout_failed(&e);
        }
    }};
}

/// `eprintln!` that drops the line when stderr is gone.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// A line to stdout was lost. A reader that is gone (EPIPE) was chosen by
/// someone; any other error (a full disk under a redirected log, EIO) would
/// make a run look quiet and well, so it is said once on stderr. Training
/// goes on either way: the checkpoints and the metrics file are what count.
pub(crate) fn stdout_failed(e: &std::io::Error) {
    use std::io::Write as _;
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    if e.kind() == std::io::ErrorKind::BrokenPipe || WARNED.swap(true, Ordering::Relaxed) {
        return;
    }
    let text = e.to_string();
    // "No space left on device (os error 28)" without the number.
    let reason = text.split(" (os error").next().unwrap_or(&text);
    let _ = writeln!(
        std::io::stderr(),
        "stdout: {reason}: epoch lines are being lost"
    );
}
