//! What a run shows while an epoch trains: on a terminal, rank 0's bar
//! redrawn in place (its line cleared and drawn again) below the ranks'
//! lines, under the
//! built-in launcher (which draws it from rank 0's records) and with
//! `--spawn threads` (the process draws it); in a file, lines and no bar.
//! The terminal is a pseudo-terminal that util-linux's `script` opens.

mod common;

use std::process::Command;

use common::{data_arg, dataset, trainer};

const STEPS: u64 = 8;

/// The flags of a short 2-rank run with running numbers every 2 steps:
/// the bar is drawn at the epoch's start, at each running point and at its
/// last step, whatever the time between steps.
fn short_run(cmd: &mut Command, spawn: &str) {
    cmd.args(["--world-size", "2", "--spawn", spawn, "--epochs", "1"])
        .args(["--max-steps", &STEPS.to_string(), "--log-every", "2"])
        .args(["--threads", "1", "--device", "cpu"])
        .args(data_arg(dataset()));
}

/// Runs `cmd` with its stdout and stderr on a pseudo-terminal; returns
/// what the terminal received.
fn on_a_terminal(cmd: &Command) -> String {
    let quote = |s: &std::ffi::OsStr| format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"));
    let line: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(quote)
        .collect();
    let mut script = Command::new("script");
    script.args(["-qefc", &line.join(" "), "/dev/null"]);
    for (var, value) in cmd.get_envs() {
        match value {
            Some(value) => script.env(var, value),
            None => script.env_remove(var),
        };
    }
    let out = script.output().unwrap_or_else(|e| {
        panic!("`script` (util-linux, Debian's bsdutils) runs this test's terminal: {e}")
    });
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}");
    text
}

/// The steps of each drawing of epoch 1's bar, in order: what follows
/// "epoch 1 [" up to "]", then "STEP/STEPS".
fn bar_steps(screen: &str) -> Vec<u64> {
    (screen.match_indices("epoch 1 ["))
        .filter_map(|(at, head)| {
            let drawn = &screen[at..];
            let (_, after) = drawn[head.len()..].split_once("] ")?;
            let (step, steps) = after.split_whitespace().next()?.split_once('/')?;
            assert_eq!(steps, STEPS.to_string(), "{drawn}");
            step.parse().ok()
        })
        .collect()
}

/// The bar was drawn again and again as the steps went, and left no trace
/// in the lines above it.
fn assert_redrawn(screen: &str) {
    let steps = bar_steps(screen);
    assert!(steps.is_sorted(), "{steps:?}\n{screen}");
    for step in [0, 2, 4, 6, STEPS] {
        assert!(
            steps.contains(&step),
            "step {step} not drawn: {steps:?}\n{screen}"
        );
    }
    // What stays on the terminal once the run is over: the bar cleared,
    // the epoch's line a line of its own (whether the bar was cleared just
    // before it or before another rank's line printed between them).
    let lines = rendered(screen);
    assert!(
        !lines.iter().any(|line| line.contains("epoch 1 [")),
        "the bar left on the screen: {lines:#?}"
    );
    assert!(
        (lines.iter()).any(|line| line
            .trim_start_matches("[rank 0] ")
            .starts_with("Epoch 01/01")),
        "the epoch line not a line of its own: {lines:#?}"
    );
}

/// The lines a terminal shows after receiving `screen`: a carriage return
/// moves to the line's start, a line feed to the next line, `ESC [ K`
/// clears to the line's end and `ESC [ 2 K` the whole line, anything else
/// overwrites what is there.
fn rendered(screen: &str) -> Vec<String> {
    let mut lines: Vec<Vec<char>> = vec![Vec::new()];
    let (mut row, mut col) = (0, 0);
    let mut chars = screen.chars();
    while let Some(c) = chars.next() {
        match c {
            '\r' => col = 0,
            '\n' => {
                (row, col) = (row + 1, 0);
                if lines.len() == row {
                    lines.push(Vec::new());
                }
            }
            '\x1b' => {
                let sequence: String = chars.by_ref().take(2).collect();
                let sequence = match sequence.as_str() {
                    "[2" => sequence + &chars.next().map(String::from).unwrap_or_default(),
                    _ => sequence,
                };
                let line = &mut lines[row];
                match sequence.as_str() {
                    "[K" => line.truncate(col),
                    "[2K" => *line = vec![' '; col],
                    _ => panic!("an escape the bar does not use: {sequence:?}"),
                }
            }
            c => {
                let line = &mut lines[row];
                if col < line.len() {
                    line[col] = c;
                } else {
                    line.push(c);
                }
                col += 1;
            }
        }
    }
    lines.into_iter().map(String::from_iter).collect()
}

#[test]
fn a_terminal_sees_rank_0s_bar_redrawn_under_the_launcher() {
    let mut cmd = trainer();
    short_run(&mut cmd, "processes");
    let screen = on_a_terminal(&cmd);
    assert!(screen.contains("launcher: started rank 1"), "{screen}");
    assert!(screen.contains("[rank 1] rank 1/2 joined"), "{screen}");
    assert_redrawn(&screen);
    // The records themselves never reach the terminal.
    assert!(!screen.contains("at\t"), "{screen}");
}

#[test]
fn a_terminal_sees_the_bar_of_ranks_run_as_threads() {
    let mut cmd = trainer();
    short_run(&mut cmd, "threads");
    let screen = on_a_terminal(&cmd);
    assert!(screen.contains("ranks run as threads"), "{screen}");
    assert_redrawn(&screen);
}

#[test]
fn a_file_gets_progress_lines_and_no_bar() {
    let mut cmd = trainer();
    short_run(&mut cmd, "processes");
    let out = cmd.args(["--progress-seconds", "0.001"]).output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(!stdout.contains('\r') && !stderr.contains('\r'), "{stderr}");
    assert!(!stderr.contains("\x1b["), "{stderr}");
    assert!(
        stderr.contains(&format!("[rank 0] epoch 1 step {STEPS}/{STEPS}: ")),
        "{stderr}"
    );
    assert!(stdout.contains("[rank 0] Epoch 01/01"), "{stdout}");
}
