//! Scratch files and folders that downloads create beside their final place
//! (so the last step is a rename on one file system), and what happens to
//! them when a run dies before it can delete them (a run stopped by a
//! signal deletes its own: see `interrupt.rs`).
//!
//! Each scratch name carries the id of the process that made it:
//! `.<kind>.<pid>-<random>`. A later run deletes those whose process is gone;
//! one whose process still runs (a concurrent run into the same folder) is
//! left alone.

use std::path::Path;

/// The prefix of this process's scratch names for `kind`.
pub fn prefix(kind: &str) -> String {
    format!(".{kind}.{}-", std::process::id())
}

/// Deletes the scratch files and folders for `kind` in `dir` that a process
/// no longer running left behind. Best effort: what cannot be read or
/// deleted stays, as it would without this sweep.
pub fn sweep_stale(dir: &Path, kind: &str) {
    // Without /proc, whether a process runs is unknown: keep everything.
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let start = format!(".{kind}.");
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(&start))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        let path = entry.path();
        let removed = if entry.file_type().is_ok_and(|t| t.is_dir()) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if removed.is_ok() {
            eprintln!(
                "removed {}, left behind by an interrupted run",
                path.display()
            );
        }
    }
}
