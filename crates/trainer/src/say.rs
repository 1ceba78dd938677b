//! Lines for the user that never take the process down: `println!` and
//! `eprintln!` panic when their reader is gone (a `| head` that exited, a
//! `tee` or an ssh session that died, a launcher killed under its workers),
//! which would end a training that nothing else stops. These drop the line
//! instead; the run goes on and its checkpoints and metrics file still tell.

/// `println!` that drops the line when stdout is gone.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that drops the line when stderr is gone.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
