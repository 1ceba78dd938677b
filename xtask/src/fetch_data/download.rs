//! One HTTP download into a temporary file beside its final location.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant};
use tempfile::NamedTempFile;
use ureq::Timeout;

use super::{Stall, scratch};
use crate::interrupt::{Interruptible, StopFlag};

/// No published file is near this; a larger body means a wrong URL or a
/// misbehaving server, and is refused before it fills the disk.
const MAX_BODY_BYTES: u64 = 64 << 20;

/// For the name lookup and the TCP connection each.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Downloads `url` into a new temporary file in `dir`. The file is deleted
/// when the returned handle is dropped unless the caller persists it, so a
/// failed, rejected or interrupted download leaves nothing behind.
///
/// Every phase is bounded: the lookup and the connection by
/// `CONNECT_TIMEOUT`, sending the request and waiting for the response
/// headers by `stall.window`, and the body by `StallGuard`. There is no cap
/// on the whole body, which a slow link that still moves data would hit.
/// Once `stop` is raised, the download ends with
/// [`Interrupted`](crate::interrupt::Interrupted) when its read under way
/// returns: at once while the body comes, within those bounds while it
/// waits for a silent server (the signal does not cut the read short).
pub(super) fn to_temp_file(
    url: &str,
    dir: &Path,
    name: &str,
    show_progress: bool,
    stall: Stall,
    stop: &StopFlag,
) -> Result<NamedTempFile> {
    let downloading = || format!("downloading {url}");
    stop.check().with_context(downloading)?;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_resolve(Some(CONNECT_TIMEOUT))
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .timeout_send_request(Some(stall.window))
        .timeout_recv_response(Some(stall.window))
        // Also bounds each read of the body: a silent server fails within
        // one window even before StallGuard's average could be taken.
        .timeout_per_read(Some(stall.window))
        .build()
        .into();
    let response = agent.get(url).call();
    // However the call ended, a signal came first.
    stop.check().with_context(downloading)?;
    let mut response = response
        .map_err(|err| call_error(err, stall))
        .with_context(|| format!("cannot download {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("cannot download {url}: the server answered HTTP {status}");
    }

    let body = response.body_mut();
    let progress = progress_bar(name, body.content_length(), show_progress)?;
    let guarded = StallGuard::new(body.with_config().limit(MAX_BODY_BYTES).reader(), stall);
    let mut reader = progress.wrap_read(Interruptible::new(guarded, stop.clone()));
    let prefix = scratch::prefix(name);
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".part");
    // tempfile's default is owner-only; the data set is no secret and other
    // users' jobs on a shared cluster file system may need to read it.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let mut part = builder
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    let copied = io::copy(&mut reader, part.as_file_mut());
    // Also on failure: the error line then stands alone on a terminal.
    progress.finish_and_clear();
    if copied.is_err() {
        stop.check().with_context(downloading)?;
    }
    copied.with_context(|| format!("download of {url} was interrupted; nothing was saved"))?;
    Ok(part)
}

/// Says which phase of the request timed out; other errors pass unchanged.
fn call_error(err: ureq::Error, stall: Stall) -> anyhow::Error {
    let phase = match &err {
        ureq::Error::Timeout(Timeout::Resolve) => {
            format!(
                "the host name did not resolve within {}",
                secs(CONNECT_TIMEOUT)
            )
        }
        ureq::Error::Timeout(Timeout::Connect) => {
            format!("no connection within {}", secs(CONNECT_TIMEOUT))
        }
        ureq::Error::Timeout(Timeout::SendRequest | Timeout::PerWrite) => {
            format!(
                "the request could not be sent within {}",
                secs(stall.window)
            )
        }
        ureq::Error::Timeout(Timeout::RecvResponse | Timeout::PerRead) => format!(
            "the server accepted the connection but sent no response headers within {}",
            secs(stall.window)
        ),
        _ => return err.into(),
    };
    anyhow::Error::new(err).context(phase)
}

fn secs(duration: Duration) -> String {
    format!("{} s", duration.as_secs())
}

/// Fails a body that stops coming: fewer than `stall.min_bytes()` in a
/// window of `stall.window`, or one read that times out (a silent server).
/// Like curl's `--speed-limit`/`--speed-time`, it judges the recent rate, not
/// the total time.
struct StallGuard<R> {
    inner: R,
    stall: Stall,
    window_start: Instant,
    window_bytes: u64,
}

impl<R> StallGuard<R> {
    fn new(inner: R, stall: Stall) -> Self {
        Self {
            inner,
            stall,
            window_start: Instant::now(),
            window_bytes: 0,
        }
    }

    fn stalled(&self) -> io::Error {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "the transfer stalled: fewer than {} bytes arrived in {}",
                self.stall.min_bytes(),
                secs(self.stall.window)
            ),
        )
    }
}

impl<R: Read> Read for StallGuard<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = match self.inner.read(buf) {
            Ok(n) => n,
            Err(err) if is_timeout(&err) => return Err(self.stalled()),
            Err(err) => return Err(err),
        };
        if n == 0 {
            return Ok(0); // complete, however slowly its last bytes came
        }
        self.window_bytes += n as u64;
        if self.window_start.elapsed() >= self.stall.window {
            if self.window_bytes < self.stall.min_bytes() {
                return Err(self.stalled());
            }
            self.window_start = Instant::now();
            self.window_bytes = 0;
        }
        Ok(n)
    }
}

/// ureq reports a read's timeout as its own error inside an `io::Error`.
fn is_timeout(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::TimedOut
        || err
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<ureq::Error>())
            .is_some_and(|inner| matches!(inner, ureq::Error::Timeout(_)))
}

/// A byte-count bar when stderr is a terminal; hidden otherwise, so logs of
/// CI and batch jobs are not filled with redraws.
fn progress_bar(name: &str, len: Option<u64>, show: bool) -> Result<ProgressBar> {
    if !show {
        return Ok(ProgressBar::hidden());
    }
    let bar = match len {
        Some(len) => ProgressBar::new(len).with_style(
            ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
            )?
            .progress_chars("=> "),
        ),
        None => ProgressBar::new_spinner().with_style(ProgressStyle::with_template(
            "{msg} {spinner} {bytes} {bytes_per_sec}",
        )?),
    };
    Ok(bar.with_message(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_timeout_is_reported_as_a_stall() {
        struct Silent;
        impl Read for Silent {
            fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
                Err(ureq::Error::Timeout(Timeout::PerRead).into_io())
            }
        }
        let stall = Stall {
            window: Duration::from_secs(2),
        };
        let err = StallGuard::new(Silent, stall)
            .read(&mut [0; 8])
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the transfer stalled: fewer than 2000 bytes arrived in 2 s"
        );
    }

    #[test]
    fn a_trickle_below_the_rate_is_a_stall() {
        // One byte per read, 2 ms apart: far below 1000 bytes/s.
        struct Trickle;
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                std::thread::sleep(Duration::from_millis(2));
                buf[0] = b'x';
                Ok(1)
            }
        }
        let stall = Stall {
            window: Duration::from_millis(50),
        };
        let mut guard = StallGuard::new(Trickle, stall);
        // Bounded, so that a guard that never fires fails the test instead of
        // hanging it: 500 reads take at least 1 s, twenty windows.
        let err = std::iter::repeat_with(|| guard.read(&mut [0; 8]))
            .take(500)
            .find_map(Result::err)
            .expect("the guard never fired");
        assert!(err.to_string().contains("stalled"), "{err}");
    }

    #[test]
    fn progress_templates_are_valid() {
        // Templates are parsed at run time; a typo would only surface on a
        // terminal. (Whether the bar then draws depends on this test's stderr.)
        assert!(progress_bar("f.gz", Some(1000), true).is_ok());
        assert!(progress_bar("f.gz", None, true).is_ok());
    }

    #[test]
    fn no_progress_bar_without_a_terminal() {
        assert!(progress_bar("f.gz", Some(1000), false).unwrap().is_hidden());
    }
}
