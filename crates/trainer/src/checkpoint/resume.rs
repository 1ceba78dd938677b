//! Rank 0's decision of where a run starts (`--resume`, `--init-from`), and
//! the rules that keep a resumed run equal to an uninterrupted one.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use core_tensor::FlatLayout;

use super::origin::Origin;
use super::{CheckpointDir, Position, Settings, TrainingState, load, load_weights};

/// `--resume`: a checkpoint directory, or `auto`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResumeFrom {
    /// The newest valid checkpoint in `--checkpoint-dir`, if any.
    Auto,
    Path(PathBuf),
}

impl ResumeFrom {
    /// The flag's value parser.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "" => Err("expects a checkpoint directory or `auto`".into()),
            "auto" => Ok(Self::Auto),
            path => Ok(Self::Path(path.into())),
        }
    }
}

/// The flags that say where a run starts.
pub struct Request<'a> {
    pub resume: Option<&'a ResumeFrom>,
    pub init_from: Option<&'a Path>,
    pub dir: Option<&'a CheckpointDir>,
}

/// Decides, on rank 0, where training starts, saying so on stderr.
pub fn choose(
    request: &Request<'_>,
    settings: &Settings,
    layout: &FlatLayout,
) -> anyhow::Result<Origin> {
    let init = |init_from: Option<&Path>| match init_from {
        Some(file) => Ok(Origin::Weights(
            load_weights(file, layout).context("--init-from")?,
        )),
        None => Ok(Origin::Fresh),
    };
    match request.resume {
        Some(ResumeFrom::Auto) => {
            let dir = request
                .dir
                .ok_or_else(|| anyhow!("--resume auto needs --checkpoint-dir"))?;
            let newest = dir.newest_valid(layout)?;
            if newest.found.is_none()
                && let Some((path, why)) = newest.skipped.first()
            {
                // Starting fresh would write over them (and prune them):
                // another model's or another data set's run, most likely.
                bail!(
                    "--checkpoint-dir {} holds {} checkpoint(s) and this run can resume none of them (the newest, {}: {why:#}); resume them with the flags they were written with, or give another --checkpoint-dir",
                    dir.path().display(),
                    newest.skipped.len(),
                    path.display()
                );
            }
            for (path, why) in &newest.skipped {
                tell!(
                    "note: skipping the invalid checkpoint {}: {why:#}",
                    path.display()
                );
            }
            match newest.found {
                Some((path, state)) => resume(&path, state, settings),
                None => {
                    let instead = if request.init_from.is_some() {
                        "starting from --init-from"
                    } else {
                        "starting fresh"
                    };
                    tell!(
                        "note: no valid checkpoint in {} yet; {instead}",
                        dir.path().display()
                    );
                    init(request.init_from)
                }
            }
        }
        Some(ResumeFrom::Path(path)) => {
            let state =
                load(path, layout).with_context(|| format!("--resume {}", path.display()))?;
            if let Some(dir) = request.dir {
                check_history(dir, Some(state.position))?;
            }
            resume(path, state, settings).with_context(|| format!("--resume {}", path.display()))
        }
        None => {
            if let Some(dir) = request.dir {
                check_history(dir, None)?;
            }
            init(request.init_from)
        }
    }
}

/// What the launcher checks before its first start, so that a restart (which
/// adds `--resume auto`) cannot turn a refused start into a resumed one. It
/// knows no model's layout (recsys' depends on its ratings file), so a
/// checkpoint's position comes from its directory's name.
pub fn preflight(resume: Option<&ResumeFrom>, dir: &CheckpointDir) -> anyhow::Result<()> {
    match resume {
        Some(ResumeFrom::Auto) => Ok(()),
        Some(ResumeFrom::Path(path)) => {
            let position = path
                .file_name()
                .and_then(|n| Position::from_dir_name(&n.to_string_lossy()))
                .with_context(|| {
                    format!(
                        "--resume {} with --max-restarts: give the checkpoint's directory as the trainer named it (ckpt-eNNNN-sNNNNNN)",
                        path.display()
                    )
                })?;
            check_history(dir, Some(position))
        }
        None => check_history(dir, None),
    }
}

/// One history per checkpoint directory: a fresh start (`from` = `None`)
/// needs it free of checkpoints, a resumed one needs none newer than where
/// it resumes. Otherwise the two histories would mix, and `--resume auto`
/// could pick the wrong one.
fn check_history(dir: &CheckpointDir, from: Option<Position>) -> anyhow::Result<()> {
    let newest = dir.list()?.pop();
    match (newest, from) {
        (Some((_, path)), None) => bail!(
            "--checkpoint-dir {} already holds checkpoints (newest {}): add --resume auto to continue from it, or use an empty directory",
            dir.path().display(),
            path.display()
        ),
        (Some((newest, path)), Some(from)) if newest > from => bail!(
            "--checkpoint-dir {} holds {}, newer than the checkpoint resumed from ({from}): use --resume auto, or another --checkpoint-dir",
            dir.path().display(),
            path.display()
        ),
        _ => Ok(()),
    }
}

fn resume(path: &Path, state: TrainingState, settings: &Settings) -> anyhow::Result<Origin> {
    for note in compatibility(&state.settings, settings, state.position)? {
        tell!("note: {note}");
    }
    tell!(
        "resuming from {} ({}, optimizer step {})",
        path.display(),
        state.position,
        state.optimizer_step
    );
    Ok(Origin::Resume(Box::new(state)))
}

/// Why this run cannot continue from a checkpoint written with `saved` at
/// `at`, or notes on the differences it may continue with.
///
/// Mid-epoch, the world size must match: it splits the epoch's samples into
/// the ranks' shards, and the position counts steps of those. At an epoch
/// boundary nothing depends on it, so it may change there (the global batch
/// changes with it, as under an elastic launcher).
pub fn compatibility(
    saved: &Settings,
    now: &Settings,
    at: Position,
) -> anyhow::Result<Vec<String>> {
    if saved.model != now.model {
        bail!(
            "the checkpoint is of --model {}, this run trains --model {}: resume it with --model {0}, or use another --checkpoint-dir",
            saved.model,
            now.model
        );
    }
    if saved.batch_size != now.batch_size {
        bail!(
            "the checkpoint was written with --batch-size {} per rank, this run has {}: continue with the same batch size",
            saved.batch_size,
            now.batch_size
        );
    }
    if saved.seed != now.seed {
        bail!(
            "the checkpoint was written with --seed {}, this run has --seed {}: the data order and dropout continue from the checkpoint's seed",
            saved.seed,
            now.seed
        );
    }
    let mut notes = Vec::new();
    if saved.world_size != now.world_size {
        if at.step > 0 {
            bail!(
                "the checkpoint was written mid-epoch ({at}) with world size {}, this run has world size {}: mid-epoch only the same world size can continue (the ranks' shards of the epoch depend on it); resume from an epoch-boundary checkpoint (ckpt-eNNNN-s000000) to change it",
                saved.world_size,
                now.world_size
            );
        }
        notes.push(format!(
            "the world size changes from {} to {} at this epoch boundary; the global batch becomes {}",
            saved.world_size,
            now.world_size,
            now.world_size * now.batch_size
        ));
    }
    if saved.lr != now.lr {
        notes.push(format!(
            "continuing with --lr {} (the checkpoint was trained with {})",
            now.lr, saved.lr
        ));
    }
    if saved.dropout != now.dropout {
        notes.push(format!(
            "continuing with dropout {} (the checkpoint was trained with {})",
            now.dropout, saved.dropout
        ));
    }
    Ok(notes)
}
