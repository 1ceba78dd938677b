//! The workers' command line: the launcher's own, less the launcher's
//! flags (the workers restart nothing and learn their place from the
//! environment).

use std::ffi::OsString;

use crate::flags::{LAUNCHER_ONLY, STANDALONE};

/// `args` less the launcher's flags.
pub(crate) fn worker_args(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let args = args.into_iter().filter(|a| a != STANDALONE);
    LAUNCHER_ONLY.into_iter().fold(args.collect(), without_flag)
}

/// `args` without `flag` and its value (`--flag V` or `--flag=V`).
pub fn without_flag(args: impl IntoIterator<Item = OsString>, flag: &str) -> Vec<OsString> {
    let mut args = args.into_iter();
    let mut kept = Vec::new();
    while let Some(arg) = args.next() {
        if arg == flag {
            args.next();
        } else if !arg
            .to_str()
            .and_then(|a| a.strip_prefix(flag))
            .is_some_and(|rest| rest.starts_with('='))
        {
            kept.push(arg);
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn workers_never_see_the_launchers_flags() {
        let given = os(&[
            "--world-size",
            "2",
            "--max-restarts",
            "3",
            "--resume=ckpt",
            "--epochs",
            "4",
            "--max-restarts=1",
        ]);
        assert_eq!(
            worker_args(given),
            os(&["--world-size", "2", "--resume=ckpt", "--epochs", "4"])
        );
        let torchrun = os(&[
            "--nnodes=2",
            "--node_rank",
            "1",
            "--standalone",
            "--rdzv-endpoint=h:1",
            "--heartbeat-timeout",
            "2",
            "--epochs",
            "4",
        ]);
        assert_eq!(worker_args(torchrun), os(&["--epochs", "4"]));
        // A longer flag with the same prefix is not the flag.
        assert_eq!(
            without_flag(os(&["--resume-x=1"]), "--resume"),
            os(&["--resume-x=1"])
        );
    }
}
