//! `--baseline REV`: the trainer as it was at another revision, bundled
//! beside this one. A device session is short and rare, and the bundle must
//! stay under what a session carries, so rather than two bundles one
//! carries a second trainer; run.sh times it with the same steps
//! (`base_train_b*`, `base_ncu_kernels`), on the same GPU in the same call.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use super::{artifacts_in, build_info, copy_all, target_dir, workspace_root};

/// Fails, naming `rev`, unless it names a commit of this repository (so
/// that a typo stops the bundle before minutes of building).
pub(super) fn check(rev: &str) -> Result<()> {
    let out = Command::new("git")
        .current_dir(workspace_root())
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{rev}^{{commit}}"))
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!("--baseline {rev}: not a commit of this repository (see `git log --oneline`)");
    }
    Ok(())
}

/// Builds the trainer at `rev` in a temporary worktree and copies it into
/// `out/baseline/bin`, with its `build-info.txt`.
pub(super) fn bundle(rev: &str, out: &Path) -> Result<()> {
    let src = target_dir().join("device-bundle-baseline-src");
    remove_worktree(&src);
    git(&["worktree", "add", "--detach"], &src, rev)
        .with_context(|| format!("--baseline {rev}: checking it out into {}", src.display()))?;
    let built = artifacts_in(
        &src,
        &target_dir().join("device-bundle-baseline"),
        &["build", "--release", "-p", "trainer", "--bin", "trainer"],
    )
    .with_context(|| format!("--baseline {rev}: building its trainer"));
    let copied = built.and_then(|trainer| {
        copy_all(&trainer, "baseline/bin", out)?;
        std::fs::write(out.join("baseline/build-info.txt"), build_info(&src))?;
        Ok(())
    });
    remove_worktree(&src);
    copied
}

/// `git <args> <path> <rev>` in this workspace.
fn git(args: &[&str], path: &Path, rev: &str) -> Result<()> {
    let out = Command::new("git")
        .current_dir(workspace_root())
        .args(args)
        .arg(path)
        .arg(rev)
        .output()
        .context("running git")?;
    if !out.status.success() {
        bail!("git: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}

/// Removes the worktree at `path` and what is left of its folder, if any
/// (an earlier run that stopped half way leaves one).
fn remove_worktree(path: &Path) {
    let _ = Command::new("git")
        .current_dir(workspace_root())
        .args(["worktree", "remove", "--force"])
        .arg(path)
        .output();
    let _ = std::fs::remove_dir_all(path);
    let _ = Command::new("git")
        .current_dir(workspace_root())
        .args(["worktree", "prune"])
        .output();
}
