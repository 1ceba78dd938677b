use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use launcher::contract::PEER_LOST_EXIT_CODE;
use trainer::cli::Cli;
use trainer::error_file;
use trainer::models::recsys::synth;
use trainer::report::{flight_report, plot};
use trainer::run::token;

/// A subcommand: its own flags, parsed from the arguments after its name.
fn subcommand<A: Parser>(run: fn(&A) -> anyhow::Result<()>) -> ExitCode {
    let args = A::parse_from(std::env::args_os().skip(1));
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(&e),
    }
}

fn main() -> ExitCode {
    match std::env::args_os().nth(1) {
        Some(a) if a == "plot" => return subcommand(plot::run),
        Some(a) if a == "synth-ratings" => return subcommand(synth::run),
        Some(a) if a == "token" => return subcommand(token::run),
        Some(a) if a == "flight-report" => return subcommand(flight_report::run),
        _ => {}
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's first paragraph names the flag and the problem (the
            // flags a missing argument is required by on its own lines);
            // the rest is a usage reminder that buries it.
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .take_while(|l| !l.is_empty())
                .map(str::trim)
                .collect();
            let line = match first.join(" ") {
                l if l.is_empty() => "invalid arguments".to_string(),
                l => l,
            };
            let _ = writeln!(std::io::stderr(), "{line} (see --help)");
            error_file::record(&line, false);
            return ExitCode::from(2);
        }
    };
    match trainer::run(cli) {
        // Every code is 0, 75 (preempted) or 128 + a signal number.
        Ok(end) => ExitCode::from(u8::try_from(end.exit_code()).unwrap_or(u8::MAX)),
        Err(e) => failed(&e),
    }
}

/// Prints `e` (and gives it to torchrun, if it asked) and picks the exit
/// code that says what kind of failure it was.
fn failed(e: &anyhow::Error) -> ExitCode {
    // Not eprintln!, which panics when stderr is gone.
    let _ = writeln!(std::io::stderr(), "error: {e:#}");
    let code = launcher::contract::failure_exit_code(e.as_ref());
    error_file::record(&format!("{e:#}"), code == PEER_LOST_EXIT_CODE);
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
