//! The release trainer the process-level benches run: `TRAINER_BIN`, else
//! the workspace's `target/release/trainer`, which they do not build.

use std::path::PathBuf;

use anyhow::{Result, bail};

/// The trainer executable, or an error saying how to build it.
pub fn path() -> Result<PathBuf> {
    let bin = std::env::var_os("TRAINER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/trainer"),
        PathBuf::from,
    );
    if !bin.exists() {
        bail!(
            "{} is missing: cargo build --release -p trainer (or set TRAINER_BIN)",
            bin.display()
        );
    }
    Ok(bin)
}
