//! `cargo xtask fetch-data movielens`: downloads GroupLens' ml-latest-small
//! (100,836 ratings) for `trainer --model recsys`. GroupLens serves it over
//! https only, and xtask is built without TLS, so `curl` downloads it and
//! `unzip` unpacks it; without either, or without a network, the task says
//! so and saves nothing. The trainer's tests never need it: they generate
//! MovieLens-format files.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub const DEFAULT_URL: &str = "https://files.grouplens.org/datasets/movielens/ml-latest-small.zip";
/// Where the ratings land, relative to the current directory.
pub const DEFAULT_DEST: &str = "data/movielens";
const HEADER: &str = "userId,movieId,rating,timestamp";

/// Downloads the zip at `url`, unpacks it into `dest`, and checks that a
/// `ratings.csv` with MovieLens' header came out of it.
pub fn run(url: &str, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)
        .with_context(|| format!("cannot create destination directory {}", dest.display()))?;
    let scratch = tempfile::tempdir_in(dest)
        .with_context(|| format!("cannot create a scratch directory in {}", dest.display()))?;
    let zip = scratch.path().join("movielens.zip");
    let mut curl = Command::new("curl");
    curl.args([
        "--fail",
        "--location",
        "--retry",
        "2",
        "--connect-timeout",
        "20",
    ])
    .arg("--output")
    .arg(&zip)
    .arg(url);
    run_tool(
        &mut curl,
        "curl",
        &format!("downloading {url} (is there a network?)"),
    )?;
    let mut unzip = Command::new("unzip");
    unzip.arg("-q").arg(&zip).arg("-d").arg(scratch.path());
    run_tool(&mut unzip, "unzip", &format!("unpacking {url}"))?;
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

fn run_tool(cmd: &mut Command, tool: &str, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| {
        format!("{what}: cannot run `{tool}`; install it (apt-get install {tool})")
    })?;
    if !status.success() {
        bail!("{what}: `{tool}` failed ({status}); nothing was saved");
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
