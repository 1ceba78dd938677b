//! One HTTP download into a temporary file beside its final location.

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::time::Duration;
use tempfile::NamedTempFile;

/// No published file is near this; a larger body means a wrong URL or a
/// misbehaving server, and is refused before it fills the disk.
const MAX_BODY_BYTES: u64 = 64 << 20;

/// Downloads `url` into a new temporary file in `dir`. The file is deleted
/// when the returned handle is dropped unless the caller persists it, so a
/// failed or rejected download leaves nothing behind.
pub(super) fn to_temp_file(
    url: &str,
    dir: &Path,
    name: &str,
    show_progress: bool,
) -> Result<NamedTempFile> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_body(Some(Duration::from_secs(600)))
        .build()
        .into();
    let mut response = agent
        .get(url)
        .call()
        .with_context(|| format!("cannot download {url}"))?;
    let status = response.status();
    if !status.is_success() {
        bail!("cannot download {url}: the server answered HTTP {status}");
    }

    let body = response.body_mut();
    let progress = progress_bar(name, body.content_length(), show_progress)?;
    let mut reader = progress.wrap_read(body.with_config().limit(MAX_BODY_BYTES).reader());
    let prefix = format!(".{name}.");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".part");
    // tempfile's default is owner-only; the data set is no secret and other
    // users' jobs on a shared cluster file system may need to read it.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644));
    let mut part = builder
        .tempfile_in(dir)
        .with_context(|| format!("cannot create a temporary file in {}", dir.display()))?;
    std::io::copy(&mut reader, part.as_file_mut())
        .with_context(|| format!("download of {url} was interrupted"))?;
    progress.finish_and_clear();
    Ok(part)
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
    use super::progress_bar;

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
