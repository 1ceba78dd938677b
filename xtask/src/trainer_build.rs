//! The workspace and the trainer as cargo builds it: what the tasks that
//! ship the trainer somewhere (`slurm-submit`, `image`) share.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

/// xtask lives one directory below the workspace root.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_owned)
}

pub fn find_on_path(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// The cargo that runs this task (`$CARGO`), else the one on PATH.
pub fn cargo() -> std::ffi::OsString {
    std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into())
}

/// The path of the trainer of cargo profile `profile`, built first when
/// `build` is set.
pub fn trainer(root: &Path, profile: &str, build: bool, must_exist: bool) -> Result<PathBuf> {
    let cargo = cargo();
    let command = format!("cargo build --profile {profile} -p trainer");
    if build {
        eprintln!("xtask: building the trainer ({command})");
        let status = Command::new(&cargo)
            .args(["build", "--profile", profile, "-p", "trainer"])
            .current_dir(root)
            .status()
            .with_context(|| format!("running `{command}`"))?;
        if !status.success() {
            bail!("`{command}` failed ({status}); fix the build first");
        }
    }
    // Cargo's own profiles keep their old folder names.
    let folder = match profile {
        "dev" | "test" => "debug",
        "bench" => "release",
        custom => custom,
    };
    let path = target_dir(&cargo, root)?.join(folder).join("trainer");
    if must_exist && !path.is_file() {
        bail!(
            "no trainer at {}; build it with `{command}` or drop --no-build",
            path.display()
        );
    }
    Ok(path)
}

/// A cargo profile's name: letters, digits, `-` and `_`.
pub fn profile_name(name: &str) -> Result<String, String> {
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    match valid {
        true => Ok(name.to_owned()),
        false => Err(format!(
            "{name:?} is not a cargo profile name (release, dev, or a [profile.NAME] of Cargo.toml)"
        )),
    }
}

/// Cargo's target directory for the workspace at `root`.
pub fn workspace_target_dir(root: &Path) -> Result<PathBuf> {
    target_dir(&cargo(), root)
}

/// Asks cargo, which accounts for CARGO_TARGET_DIR and `build.target-dir`.
fn target_dir(cargo: &OsStr, root: &Path) -> Result<PathBuf> {
    let out = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .output()
        .context("running `cargo metadata`")?;
    if !out.status.success() {
        bail!(
            "`cargo metadata` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let metadata: serde_json::Value =
        serde_json::from_slice(&out.stdout).context("parsing `cargo metadata` output")?;
    let dir = metadata["target_directory"]
        .as_str()
        .context("`cargo metadata` output has no target_directory")?;
    Ok(PathBuf::from(dir))
}
