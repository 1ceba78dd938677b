//! `cargo xtask fetch-data movielens`: downloads GroupLens' ml-latest-small
//! (100,836 ratings) for `trainer --model recsys`. GroupLens serves it over
//! https only, and xtask is built without TLS, so `curl` downloads it and
//! `unzip` unpacks it; without either, or without a network, the task says
//! so and saves nothing. The trainer's tests never need it: they generate
//! MovieLens-format files.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};

use super::{Stall, scratch};
use crate::interrupt::StopFlag;

pub const DEFAULT_URL: &str = "https://files.grouplens.org/datasets/movielens/ml-latest-small.zip";
/// Where the ratings land, relative to the current directory.
pub const DEFAULT_DEST: &str = "data/movielens";
const HEADER: &str = "userId,movieId,rating,timestamp";
/// The scratch folder's kind (see `scratch`).
const SCRATCH: &str = "movielens";
/// curl's exit status for "operation timed out".
const CURL_TIMED_OUT: i32 = 28;

/// Downloads the zip at `url`, unpacks it into `dest`, and checks that a
/// `ratings.csv` with MovieLens' header came out of it.
pub fn run(url: &str, dest: &Path, stall: Stall) -> Result<()> {
    std::fs::create_dir_all(dest)
        .with_context(|| format!("cannot create destination directory {}", dest.display()))?;
    // A run killed by SIGKILL (or before the handlers below) leaves its
    // scratch folder; this one deletes it.
    scratch::sweep_stale(dest, SCRATCH);
    let stop = StopFlag::install()?;
    // Removed when dropped: on success, on every error and, through
    // `stop`, on SIGINT, SIGTERM and SIGHUP.
    let scratch = tempfile::Builder::new()
        .prefix(&scratch::prefix(SCRATCH))
        .tempdir_in(dest)
        .with_context(|| format!("cannot create a scratch directory in {}", dest.display()))?;
    let zip = scratch.path().join("movielens.zip");
    let mut curl = Command::new("curl");
    let window = stall.window.as_secs().to_string();
    curl.args(["--fail", "--location", "--connect-timeout", "20"])
        // A stall detector rather than --max-time, which a slow link that
        // still moves data would hit; it also bounds the wait for the
        // headers.
        .args(["--speed-limit", &Stall::MIN_BYTES_PER_SEC.to_string()])
        .args(["--speed-time", &window])
        // A quick transient failure (HTTP 503, a reset connection) is tried
        // again, but no try starts a window after the first began: a stall
        // lasts a window, so it is not retried (each try would wait a
        // window of its own), and a stalled download fails after about
        // one window, plus the connection's time.
        .args(["--retry", "2", "--retry-max-time", &window]);
    if !std::io::stderr().is_terminal() {
        // The progress meter's \r redraws would fill a log; errors still show.
        curl.args(["--silent", "--show-error"]);
    }
    curl.arg("--output").arg(&zip).arg(url);
    let downloading = format!("downloading {url} (is there a network?)");
    let why = |code| {
        (code == Some(CURL_TIMED_OUT)).then(|| {
            format!(
                "timed out: no connection within 20 s, or under {} bytes/s for {} s; a stall is not retried",
                Stall::MIN_BYTES_PER_SEC,
                stall.window.as_secs()
            )
        })
    };
    run_tool(&mut curl, "curl", &downloading, &stop, why)?;
    let mut unzip = Command::new("unzip");
    unzip.arg("-q").arg(&zip).arg("-d").arg(scratch.path());
    let unpacking = format!("unpacking {url}");
    run_tool(&mut unzip, "unzip", &unpacking, &stop, |_| None)?;
    let ratings = find_ratings(scratch.path())?;
    let target = dest.join("ratings.csv");
    std::fs::rename(&ratings, &target)
        .with_context(|| format!("cannot move ratings.csv to {}", target.display()))?;
    eprintln!(
        "MovieLens ratings are ready: trainer --model recsys --ratings {}",
        target.display()
    );
    Ok(())
}

/// Runs `cmd` to its end, or until a signal comes: then it kills the tool
/// and returns [`Interrupted`](crate::interrupt::Interrupted), so that the
/// caller's scratch folder is deleted on the way out. `why` may explain an
/// exit code.
fn run_tool(
    cmd: &mut Command,
    tool: &str,
    what: &str,
    stop: &StopFlag,
    why: impl Fn(Option<i32>) -> Option<String>,
) -> Result<()> {
    let mut child = cmd.spawn().with_context(|| {
        format!("{what}: cannot run `{tool}`; install it (apt-get install {tool})")
    })?;
    let status = loop {
        // Checked first: Ctrl-C reaches the tool too, which then fails.
        if let Err(interrupted) = stop.check() {
            let _ = child.kill();
            let _ = child.wait();
            return Err(interrupted).context(what.to_owned());
        }
        if let Some(status) = child
            .try_wait()
            .with_context(|| format!("{what}: cannot wait for `{tool}`"))?
        {
            break status;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    stop.check().context(what.to_owned())?;
    if !status.success() {
        match why(status.code()) {
            Some(why) => bail!("{what}: `{tool}` failed ({status}, {why}); nothing was saved"),
            None => bail!("{what}: `{tool}` failed ({status}); nothing was saved"),
        }
    }
    Ok(())
}

/// The archive's `ratings.csv` (under its one top-level folder), checked.
fn find_ratings(dir: &Path) -> Result<PathBuf> {
    let mut found = None;
    for entry in std::fs::read_dir(dir)? {
        let candidate = entry?.path().join("ratings.csv");
        if candidate.is_file() {
            found = Some(candidate);
        }
    }
    let path = found.context("the archive holds no <folder>/ratings.csv; nothing was saved")?;
    let text = std::fs::read_to_string(&path).context("reading the unpacked ratings.csv")?;
    if !text.starts_with(HEADER) {
        bail!("the unpacked ratings.csv does not start with `{HEADER}`; nothing was saved");
    }
    Ok(path)
}
