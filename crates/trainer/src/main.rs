use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;
use trainer::cli::Cli;
use trainer::stop::PREEMPTED_EXIT_CODE;
use trainer::train::RunOutcome;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            // clap's first line names the flag and the problem; the rest is
            // a usage reminder that buries it.
            let text = e.render().to_string();
            eprintln!(
                "{} (see --help)",
                text.lines().next().unwrap_or("invalid arguments")
            );
            return ExitCode::from(2);
        }
    };
    match trainer::run(cli) {
        Ok(RunOutcome::Completed) => ExitCode::SUCCESS,
        Ok(RunOutcome::Preempted { .. }) => ExitCode::from(PREEMPTED_EXIT_CODE as u8),
        // As a shell reports a process ended by SIGINT.
        Ok(RunOutcome::Interrupted { .. }) => ExitCode::from(130),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
