//! `cargo xtask fetch-data`: downloads FashionMNIST for machines without
//! Debian's `dataset-fashion-mnist` package (`fetch-data movielens`: the
//! MovieLens ratings instead, see `movielens.rs`).
//!
//! Each file is verified against `fashion_mnist::FILES` (length and SHA-256
//! of the decompressed content) before it appears under its final name, so
//! an interrupted or corrupted download can never be mistaken for the data
//! set by the trainer. Files already present and valid are not downloaded
//! again, which makes the task safe to re-run. SIGINT, SIGTERM and SIGHUP
//! stop the download under way, delete its temporary file and end the task
//! with exit status 130 (see `interrupt.rs`); files completed before stay.

mod download;
mod movielens;
mod scratch;

pub use crate::interrupt::{EXIT_STATUS as INTERRUPTED_EXIT_STATUS, Interrupted};

use anyhow::{Context, Result, bail};
use fashion_mnist::{DataFile, FILES};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::interrupt::StopFlag;

/// The official mirror of the Fashion-MNIST authors.
const DEFAULT_URL: &str = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/";

/// Which data set to fetch.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataSet {
    /// The four FashionMNIST .gz files, verified against their checksums.
    FashionMnist,
    /// MovieLens ml-latest-small's ratings.csv (with curl and unzip).
    Movielens,
}

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The data set.
    #[arg(value_enum, default_value = "fashion-mnist")]
    data_set: DataSet,
    /// FashionMNIST: base URL the four .gz files are fetched from (plain
    /// http://) [default: the authors' mirror]. MovieLens: the zip's URL
    /// [default: GroupLens' ml-latest-small.zip].
    #[arg(long)]
    url: Option<String>,
    /// Directory to put the files in, relative to the current directory; the
    /// trainer looks in data/fashion-mnist/ when run from the workspace root
    /// [default: data/fashion-mnist, or data/movielens].
    #[arg(long, value_name = "DIR")]
    dest: Option<PathBuf>,
    /// A download that waits this long for the response headers, or gets
    /// fewer than 1000 bytes/s over this long, is abandoned. Hidden: it is
    /// for the tests, which set it low so that a stalled server fails them
    /// in seconds.
    #[arg(long, hide = true, default_value_t = 30, value_name = "SECS",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    stall_secs: u64,
}

/// How long a download may go without progress; see `Args::stall_secs`.
#[derive(Clone, Copy, Debug)]
pub struct Stall {
    pub window: Duration,
}

impl Stall {
    /// Slower than this on average over a whole window counts as stalled
    /// (curl's `--speed-limit`). At this rate FashionMNIST would take 8 hours,
    /// so no link worth waiting for is cut off.
    pub const MIN_BYTES_PER_SEC: u64 = 1000;

    /// The fewest bytes a window must bring.
    pub fn min_bytes(&self) -> u64 {
        u64::try_from(u128::from(Self::MIN_BYTES_PER_SEC) * self.window.as_millis() / 1000)
            .unwrap_or(u64::MAX)
    }
}

pub fn run(args: Args) -> Result<()> {
    let stall = Stall {
        window: Duration::from_secs(args.stall_secs),
    };
    if args.data_set == DataSet::Movielens {
        let dest = args.dest.unwrap_or_else(|| movielens::DEFAULT_DEST.into());
        let url = args.url.as_deref().unwrap_or(movielens::DEFAULT_URL);
        return movielens::run(url, &dest, stall);
    }
    let url = args.url.unwrap_or_else(|| DEFAULT_URL.into());
    let dest = args.dest.unwrap_or_else(|| fashion_mnist::LOCAL_DIR.into());
    fetch_fashion_mnist(&url, &dest, stall)
}

fn fetch_fashion_mnist(url: &str, dest: &Path, stall: Stall) -> Result<()> {
    let base = base_url(url)?;
    std::fs::create_dir_all(dest)
        .with_context(|| format!("cannot create destination directory {}", dest.display()))?;
    let show_progress = std::io::stderr().is_terminal();
    let stop = StopFlag::install()?;
    for file in &FILES {
        // A run killed mid-download (SIGKILL, or a signal before the
        // handlers) cannot delete its temporary file; the next run does.
        scratch::sweep_stale(dest, file.name);
        fetch_one(file, &base, dest, show_progress, stall, &stop)?;
    }
    eprintln!("FashionMNIST is ready in {}", dest.display());
    Ok(())
}

/// Makes sure `dest/<file.name>` holds the verified file, downloading it
/// only if it is absent or invalid.
fn fetch_one(
    file: &DataFile,
    base: &str,
    dest: &Path,
    show_progress: bool,
    stall: Stall,
    stop: &StopFlag,
) -> Result<()> {
    let target = dest.join(file.name);
    match std::fs::read(&target) {
        Ok(existing) => match file.verify_gz(&existing) {
            Ok(()) => {
                eprintln!("{}: already present and valid, skipped", file.name);
                return Ok(());
            }
            Err(problem) => eprintln!(
                "{}: present but invalid ({problem}), downloading again",
                file.name
            ),
        },
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("cannot read {}", target.display())),
    }

    let url = format!("{base}{}", file.name);
    let part = download::to_temp_file(&url, dest, file.name, show_progress, stall, stop)?;
    let downloaded = std::fs::read(part.path())
        .with_context(|| format!("cannot read back {}", part.path().display()))?;
    file.verify_gz(&downloaded).with_context(|| {
        format!(
            "{} downloaded from {url} failed verification; nothing was saved",
            file.name
        )
    })?;
    // The temporary file lives in `dest`, so this is an atomic rename on the
    // same file system: the final name only ever holds a verified file.
    part.persist(&target)
        .with_context(|| format!("cannot move the verified download to {}", target.display()))?;
    eprintln!("{}: downloaded and verified", file.name);
    Ok(())
}

/// Validates `url` and returns it with exactly one trailing slash, ready for
/// a file name to be appended.
fn base_url(url: &str) -> Result<String> {
    if url.starts_with("https://") {
        bail!(
            "{url}: https is not supported (xtask is built without TLS to keep it small); use an http:// mirror"
        );
    }
    if !url.starts_with("http://") {
        bail!("{url}: the base URL must start with http://");
    }
    Ok(format!("{}/", url.trim_end_matches('/')))
}

#[cfg(test)]
mod tests {
    use super::base_url;

    #[test]
    fn base_url_gets_one_trailing_slash() {
        assert_eq!(base_url("http://mirror/x").unwrap(), "http://mirror/x/");
        assert_eq!(base_url("http://mirror/x//").unwrap(), "http://mirror/x/");
    }

    #[test]
    fn base_url_rejects_other_schemes() {
        let https = base_url("https://mirror/").unwrap_err().to_string();
        assert!(https.contains("https is not supported"), "{https}");
        let ftp = base_url("ftp://mirror/").unwrap_err().to_string();
        assert!(ftp.contains("must start with http://"), "{ftp}");
    }
}
