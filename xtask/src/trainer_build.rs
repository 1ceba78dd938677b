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

/// An executable cargo built: one `compiler-artifact` line of its
/// `--message-format=json` output.
pub struct Executable {
    pub path: PathBuf,
    /// The target's name and kind (`lib`, `bin`, `test`, `bench`).
    pub target: String,
    pub kind: String,
    /// The package's `Cargo.toml`, and its name.
    pub manifest: PathBuf,
    pub package: String,
    /// Built in the test profile (what `cargo test` runs).
    pub test: bool,
}

/// The executable one line of cargo's JSON messages names, if any.
pub fn executable(line: &str) -> Option<Executable> {
    let msg: serde_json::Value = serde_json::from_str(line).ok()?;
    if msg["reason"] != "compiler-artifact" {
        return None;
    }
    let target = msg["target"]["name"].as_str()?;
    Some(Executable {
        path: msg["executable"].as_str()?.into(),
        target: target.to_owned(),
        kind: msg["target"]["kind"][0]
            .as_str()
            .unwrap_or("bin")
            .to_owned(),
        manifest: msg["manifest_path"].as_str()?.into(),
        package: package_name(msg["package_id"].as_str()?)
            .unwrap_or(target)
            .to_owned(),
        test: msg["profile"]["test"] == true,
    })
}

/// The package's name from cargo's package id (`path+file:///…/comm#0.1.0`,
/// `path+file:///…/x#name@0.1.0`).
fn package_name(id: &str) -> Option<&str> {
    let (path, fragment) = id.rsplit_once('#')?;
    match fragment.split_once('@') {
        Some((name, _version)) => Some(name),
        // `…/comm#0.1.0`: the folder is the name.
        None => path.rsplit('/').next(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_package_is_read_from_either_form_of_a_package_id() {
        assert_eq!(
            package_name("path+file:///work/main/crates/comm#0.1.0"),
            Some("comm")
        );
        assert_eq!(
            package_name("path+file:///work/main/crates/tensor#core-tensor@0.1.0"),
            Some("core-tensor")
        );
    }
}
