//! `trainer token PATH`: a fresh job token in a file only its owner can
//! read, for `--auth-token-file PATH` (or `TRAINER_AUTH_TOKEN`) on every
//! rank and launcher of a job that runs on several machines.

use std::fs::{File, OpenOptions, Permissions};
use std::io::{ErrorKind, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Parser;
use comm::AuthToken;

/// `trainer token`'s flags.
#[derive(Debug, Parser)]
#[command(
    name = "trainer token",
    about = "Writes a fresh job token (256 random bits, 64 hex digits) to a new file of mode 600, for --auth-token-file"
)]
pub struct TokenArgs {
    /// The file to write; it must not exist yet, unless --force.
    #[arg(value_name = "PATH")]
    pub path: PathBuf,

    /// Replace an existing file (every rank then needs the new token).
    #[arg(long)]
    pub force: bool,
}

/// Writes a fresh token to `args.path`.
pub fn run(args: &TokenArgs) -> anyhow::Result<()> {
    let path = &args.path;
    let token = AuthToken::generate()?;
    let mut file = create_private(path, args.force)?;
    writeln!(file, "{}", token.to_hex())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the token file {}", path.display()))?;
    tell!(
        "wrote a fresh job token to {0} (mode 600); give every rank and launcher of the job --auth-token-file {0}, or TRAINER_AUTH_TOKEN=\"$(cat {0})\"",
        path.display()
    );
    Ok(())
}

/// A new file at `path` that only its owner can read and write. O_EXCL
/// refuses whatever is there (a symbolic link included), so the token never
/// lands in a file another user made or can read; `force` removes an old
/// file first.
fn create_private(path: &Path, force: bool) -> anyhow::Result<File> {
    if force {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing the old {}", path.display()));
            }
            _ => {}
        }
    }
    let created = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let file = match created {
        Err(e) if e.kind() == ErrorKind::AlreadyExists => bail!(
            "{} already exists; pass --force to replace it (every rank then needs the new token), or name another file",
            path.display()
        ),
        other => other.with_context(|| format!("creating the token file {}", path.display()))?,
    };
    // Exactly 600, whatever the umask left.
    file.set_permissions(Permissions::from_mode(0o600))
        .with_context(|| format!("making {} private", path.display()))?;
    Ok(file)
}
