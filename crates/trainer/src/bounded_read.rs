//! Reading a whole file the trainer was pointed at, only when it is a
//! regular file no larger than what it can hold: `/dev/zero` or a wrong
//! multi-gigabyte file must be an error, not an exhausted memory.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};

/// The contents of `path`, refused unless it is a regular file of at most
/// `limit` bytes (`what` it should be, for the message).
pub fn read(path: &Path, limit: u64, what: &str) -> anyhow::Result<Vec<u8>> {
    let file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?;
    if !meta.is_file() {
        bail!("{} is not a regular file (want {what})", path.display());
    }
    if meta.len() > limit {
        bail!(
            "{} holds {} bytes, more than {what} can ({limit} at most)",
            path.display(),
            meta.len()
        );
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow while read: never past the limit.
    file.take(limit)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_regular_files_within_the_limit_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"12345").unwrap();
        assert_eq!(read(&path, 5, "x").unwrap(), b"12345");
        let err = read(&path, 4, "a tiny file").unwrap_err().to_string();
        assert!(
            err.contains("holds 5 bytes, more than a tiny file can (4 at most)"),
            "{err}"
        );
        let err = read(dir.path(), 5, "x").unwrap_err().to_string();
        assert!(err.contains("is not a regular file"), "{err}");
        let err = read(Path::new("/dev/zero"), 5, "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a regular file"), "{err}");
    }
}
