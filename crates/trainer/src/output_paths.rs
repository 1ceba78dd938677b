//! Start-up checks of where the run writes (`--checkpoint-dir`,
//! `--metrics`), so that a bad path fails before training, not after the
//! first epoch. Missing directories are created, and the run says so.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// Checks and prepares rank 0's output paths (`--checkpoint-dir`,
/// `--metrics`); prints a note for each directory it creates.
pub fn prepare(checkpoints: Option<&Path>, metrics: Option<&Path>) -> anyhow::Result<()> {
    if let Some(dir) = checkpoints {
        for note in checkpoint_dir(dir)? {
            tell!("note: {note}");
        }
    }
    if let Some(file) = metrics {
        for note in metrics_file(file)? {
            tell!("note: {note}");
        }
    }
    Ok(())
}

/// `--checkpoint-dir`: a writable directory, created with its parents.
pub fn checkpoint_dir(dir: &Path) -> anyhow::Result<Vec<String>> {
    const FLAG: &str = "--checkpoint-dir";
    if dir.exists() && !dir.is_dir() {
        bail!(
            "{FLAG} {} is a file, not a directory: remove it or give another path",
            dir.display()
        );
    }
    let notes = create_dir(dir, FLAG)?;
    check_writable(dir, FLAG, dir)?;
    Ok(notes)
}

/// `--metrics`: a file (not a directory) that can be written, in a
/// directory created with its parents when missing. An existing file is
/// left as it is here.
pub fn metrics_file(file: &Path) -> anyhow::Result<Vec<String>> {
    const FLAG: &str = "--metrics";
    if file.is_dir() {
        bail!(
            "{FLAG} {} is a directory; give a file path such as {}",
            file.display(),
            file.join("metrics.jsonl").display()
        );
    }
    let parent = match file.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let notes = create_dir(&parent, FLAG)?;
    if file.exists() {
        File::options()
            .append(true)
            .open(file)
            .with_context(|| not_writable(FLAG, file))?;
    } else {
        check_writable(&parent, FLAG, file)?;
    }
    Ok(notes)
}

/// Creates `dir` and its missing parents; a note naming what was created.
fn create_dir(dir: &Path, flag: &str) -> anyhow::Result<Vec<String>> {
    if dir.is_dir() {
        return Ok(Vec::new());
    }
    fs::create_dir_all(dir).with_context(|| {
        format!(
            "{flag}: cannot create the directory {} (create it yourself or choose a writable place)",
            dir.display()
        )
    })?;
    Ok(vec![format!(
        "created {} (for {flag}), with any missing parents",
        dir.display()
    )])
}

/// Creates and removes a probe file in `dir`: permission bits alone do not
/// tell (root, read-only mounts, ACLs).
fn check_writable(dir: &Path, flag: &str, named: &Path) -> anyhow::Result<()> {
    let probe = dir.join(format!(".write-check-{}", std::process::id()));
    match File::options().write(true).create_new(true).open(&probe) {
        Ok(_) => {
            let _ = fs::remove_file(&probe);
            Ok(())
        }
        // Left by a process of the same pid on another host: it was writable.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| not_writable(flag, named)),
    }
}

fn not_writable(flag: &str, path: &Path) -> String {
    format!(
        "{flag} {}: cannot write there (check its permissions and that the file system is not read-only, or choose another path)",
        path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_directories_are_created_and_said() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b/ckpt");
        let notes = checkpoint_dir(&dir).unwrap();
        assert!(dir.is_dir());
        assert!(notes[0].contains("created") && notes[0].contains("--checkpoint-dir"));
        assert!(checkpoint_dir(&dir).unwrap().is_empty(), "said once");
        let file = tmp.path().join("c/d/metrics.jsonl");
        let notes = metrics_file(&file).unwrap();
        assert!(file.parent().unwrap().is_dir() && !file.exists());
        assert!(notes[0].contains("created") && notes[0].contains("--metrics"));
        assert!(
            fs::read_dir(tmp.path().join("a/b/ckpt"))
                .unwrap()
                .next()
                .is_none()
        );
    }

    #[test]
    fn the_wrong_kind_of_path_is_named_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("plain");
        fs::write(&file, b"x").unwrap();
        let err = checkpoint_dir(&file).unwrap_err().to_string();
        assert!(err.contains("is a file") && err.contains("plain"), "{err}");
        let err = metrics_file(tmp.path()).unwrap_err().to_string();
        assert!(
            err.contains("is a directory") && err.contains("metrics.jsonl"),
            "{err}"
        );
        let under_a_file = file.join("ckpt");
        let err = format!("{:#}", checkpoint_dir(&under_a_file).unwrap_err());
        assert!(err.contains("cannot create"), "{err}");
    }
}
