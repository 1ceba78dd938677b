//! Rank 0's decision of where a run starts (`--resume`, `--init-from`), and
//! the rules that keep a resumed run equal to an uninterrupted one.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use core_tensor::FlatLayout;

use super::origin::Origin;
use super::shared_record;
use super::{CheckpointDir, Position, Settings, Summation, TrainingState, load, load_weights};
use launcher::contract::Misconfigured;

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
                bail!(Misconfigured(format!(
                    "--checkpoint-dir {} holds {} checkpoint(s) and this run can resume none of them (the newest, {}: {why:#}); resume them with the flags they were written with, or give another --checkpoint-dir",
                    dir.path().display(),
                    newest.skipped.len(),
                    path.display()
                )));
            }
            for (path, why) in &newest.skipped {
                tell!(
                    "note: skipping the invalid checkpoint {}: {why:#}",
                    path.display()
                );
            }
            match newest.found {
                Some((path, state)) => resume(&path, state, settings)
                    .with_context(|| format!("--resume auto chose {}", path.display())),
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
/// could pick the wrong one. A refusal is the flags' (exit 78): a restart,
/// which would resume, must not follow it.
fn check_history(dir: &CheckpointDir, from: Option<Position>) -> anyhow::Result<()> {
    let newest = dir.list()?.pop();
    match (newest, from) {
        (Some((_, path)), None) => bail!(Misconfigured(format!(
            "--checkpoint-dir {} already holds checkpoints (newest {}): add --resume auto to continue from it, or use an empty directory",
            dir.path().display(),
            path.display()
        ))),
        (Some((newest, path)), Some(from)) if newest > from => bail!(Misconfigured(format!(
            "--checkpoint-dir {} holds {}, newer than the checkpoint resumed from ({from}): use --resume auto, or another --checkpoint-dir",
            dir.path().display(),
            path.display()
        ))),
        _ => Ok(()),
    }
}

fn resume(path: &Path, mut state: TrainingState, settings: &Settings) -> anyhow::Result<Origin> {
    // A refusal here is the job's flags or data against the checkpoint's:
    // no restart would see it otherwise.
    let mut notes = compatibility(&state.settings, settings, state.position, path)
        .map_err(|refusal| Misconfigured(format!("{refusal:#}")))?;
    notes.extend(hook_rule(&mut state, settings));
    for note in notes {
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

/// Why this run cannot continue from the checkpoint `checkpoint`, written
/// with `saved` at `at`, or notes on the differences it may continue with.
///
/// The layout (world size, pipeline stages) may change anywhere: at an
/// epoch boundary nothing depends on it, and mid-epoch the rest of the
/// epoch's order is shared out over the new replicas (`crate::data::Resumed`;
/// the streamed ratings refuse that); the global batch changes with it, as
/// under an elastic launcher. The training data has its own rule
/// ([`data_rule`]).
pub fn compatibility(
    saved: &Settings,
    now: &Settings,
    at: Position,
    checkpoint: &Path,
) -> anyhow::Result<Vec<String>> {
    if saved.model != now.model {
        bail!(
            "the checkpoint is of --model {}, this run trains --model {}: resume it with --model {0}, or use another --checkpoint-dir",
            saved.model,
            now.model
        );
    }
    if saved.summation != now.summation {
        bail!(
            "the checkpoint was trained {}, this run {}: continue it the same way, or use another --checkpoint-dir",
            saved.summation.flags(),
            now.summation.flags()
        );
    }
    // With --reproducible the global batch alone defines a step: the
    // layout, the per-rank batch and the accumulation may all change, and
    // the run goes on to the bits of one that never stopped.
    let exact = match now.summation {
        Summation::Exact { global_batch, .. } => Some(global_batch),
        Summation::Ring => None,
    };
    if exact.is_none() && saved.batch_size != now.batch_size {
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
    let mut notes: Vec<String> = data_rule(saved, now, at, checkpoint)?.into_iter().collect();
    if exact.is_none() && saved.accumulate_steps != now.accumulate_steps {
        if at.step > 0 {
            bail!(
                "the checkpoint was written mid-epoch ({at}) with --accumulate-steps {}, this run has {}: its position counts optimizer steps of that many micro-batches; continue with the same --accumulate-steps, or resume from an epoch-boundary checkpoint (ckpt-eNNNN-s000000) to change it",
                saved.accumulate_steps,
                now.accumulate_steps
            );
        }
        notes.push(format!(
            "continuing with --accumulate-steps {} (the checkpoint was trained with {})",
            now.accumulate_steps, saved.accumulate_steps
        ));
    }
    if (saved.world_size, saved.pipeline_stages) != (now.world_size, now.pipeline_stages) {
        let global_batch = now.replicas() * now.batch_size;
        notes.push(match (exact, at.step) {
            (Some(global_batch), _) => format!(
                "the layout changes from {} to {} ({at}): --reproducible goes on in the same global batches of {global_batch}, to the bits of a run that never stopped",
                layout(saved),
                layout(now)
            ),
            (None, 0) => format!(
                "the layout changes from {} to {} at this epoch boundary; the global batch becomes {global_batch}",
                layout(saved),
                layout(now)
            ),
            (None, _) => format!(
                "the layout changes from {} to {} mid-epoch ({at}): the rest of the epoch's samples are shared out over {} replicas (none lost, none read twice but the padding), in global batches of {global_batch}",
                layout(saved),
                layout(now),
                now.replicas()
            ),
        });
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
    notes.extend(other_flags(saved, now));
    Ok(notes)
}

/// The shared flags' fields that the rules above judge (refused, or a note
/// of their own).
const JUDGED: [&str; 10] = [
    "model",
    "batch_size",
    "seed",
    "accumulate_steps",
    "pipeline_stages",
    "lr",
    "no_dropout",
    "reproducible",
    "global_batch",
    "unit",
];

/// A note naming every other shared flag this run changed from the
/// checkpoint's (`--epochs`, `--max-steps`, `--bucket-mb`, ...): each may
/// change, and a user should see that it did.
fn other_flags(saved: &Settings, now: &Settings) -> Option<String> {
    let (Some(then), Some(now)) = (&saved.shared, &now.shared) else {
        return None;
    };
    let judged = JUDGED.map(|field| format!("--{}", field.replace('_', "-")));
    let changed: Vec<String> = (shared_record::differences(now, then).into_iter())
        .filter(|d| !judged.contains(&d.flag))
        .map(|d| format!("{} {} (it had {})", d.flag, d.values[0], d.values[1]))
        .collect();
    (!changed.is_empty()).then(|| {
        format!(
            "continuing with other flags than the checkpoint's run: {}",
            changed.join(", ")
        )
    })
}

/// What of PowerSGD's state (`--comm-hook powersgd`) this run carries on:
/// all of it with the same RANK (START may change: it only says when
/// compression begins); with another hook or RANK nothing, and with
/// another world size (at an epoch boundary) the `Q`s but not the ranks'
/// error feedback, which restarts at zero. A note for what is dropped.
fn hook_rule(state: &mut TrainingState, now: &Settings) -> Option<String> {
    let hook = state.hook.as_mut()?;
    // `powersgd:RANK`, START left out.
    let rank_of = |hook: &str| hook.split(':').take(2).collect::<Vec<_>>().join(":");
    let saved = &state.settings;
    if rank_of(&saved.comm_hook) != rank_of(&now.comm_hook) {
        let note = format!(
            "PowerSGD's state is not carried on: the checkpoint was trained with --comm-hook {}, this run has {}",
            saved.comm_hook, now.comm_hook
        );
        state.hook = None;
        return Some(note);
    }
    if saved.world_size != now.world_size {
        hook.errors.clear();
        return Some(format!(
            "PowerSGD's error feedback restarts at zero: it belonged to the checkpoint's {} ranks, this run has {}",
            saved.world_size, now.world_size
        ));
    }
    None
}

/// How the ranks of a run are laid out, in words.
fn layout(s: &Settings) -> String {
    match s.pipeline_stages {
        1 => format!("world size {}", s.world_size),
        stages => format!(
            "world size {} ({} pipeline(s) of {stages} stages)",
            s.world_size,
            s.world_size / stages
        ),
    }
}

/// The training data's rule. Mid-epoch, a checkpoint's position is a place
/// in the sampler's shuffled order of the data it was trained on, and its
/// running metrics are sums over that data: on other data the place means
/// nothing and the epoch's numbers would mix two data sets, so it is
/// refused. At an epoch boundary nothing of the old data is carried over,
/// and going on with other data (fine-tuning) is legitimate: a note. A
/// checkpoint from before the data were recorded cannot be checked: it
/// resumes as before, with a note mid-epoch.
fn data_rule(
    saved: &Settings,
    now: &Settings,
    at: Position,
    checkpoint: &Path,
) -> anyhow::Result<Option<String>> {
    let (Some(then), Some(now)) = (saved.data, now.data) else {
        return Ok((saved.data.is_none() && at.step > 0).then(|| {
            format!(
                "the checkpoint does not record its training data (written before data fingerprints), so this run cannot check that it continues {at} on the same data"
            )
        }));
    };
    let Some(how) = then.difference(now) else {
        return Ok(None);
    };
    if at.step > 0 {
        bail!(
            "the checkpoint was saved mid-epoch ({at}) on other training data than this run's: {how}; its position is a place in that data's shuffled order. Resume it with the data it was saved with, or start from its weights with --init-from {} and a new --checkpoint-dir (a fresh epoch 1 and optimizer)",
            checkpoint.join(super::MODEL_FILE).display()
        );
    }
    Ok(Some(format!(
        "this run's training data differ from the checkpoint's ({how}); it was saved at an epoch boundary, so epoch {} starts on this run's data",
        at.epoch
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::DataFingerprint;

    const DATA: DataFingerprint = DataFingerprint {
        samples: 512,
        hash: 0x00c0_ffee_0000_0001,
    };

    /// Where `compatibility` is told the checkpoint lies.
    const CKPT: &str = "ckpt/ckpt-e0002-s000005";

    fn settings() -> Settings {
        Settings {
            seed: 4,
            world_size: 2,
            batch_size: 32,
            data: Some(DATA),
            ..Settings::default()
        }
    }

    /// Every shared flag a resumed run changed is named once: by its own
    /// rule's note, or else in the note of the others.
    #[test]
    fn a_resumed_run_names_the_shared_flags_it_changed() {
        let record = |text: &str| match serde_json::from_str(text).unwrap() {
            serde_json::Value::Object(map) => Some(map),
            _ => unreachable!(),
        };
        let saved = Settings {
            shared: record(r#"{"epochs":3,"lr":0.001,"max_steps":null,"bucket_mb":25.0}"#),
            ..settings()
        };
        let now = Settings {
            lr: 0.01,
            shared: record(r#"{"epochs":5,"lr":0.01,"max_steps":30,"bucket_mb":25.0}"#),
            ..settings()
        };
        let at = Position { epoch: 2, step: 0 };
        let notes = compatibility(&saved, &now, at, Path::new(CKPT)).unwrap();
        assert_eq!(
            notes,
            [
                "continuing with --lr 0.01 (the checkpoint was trained with 0.001)",
                "continuing with other flags than the checkpoint's run: --epochs 5 (it had 3), --max-steps 30 (it had (not given))",
            ]
        );
        // A checkpoint from before the record: only the rules' notes.
        let old = Settings {
            shared: None,
            ..saved
        };
        let notes = compatibility(&old, &now, at, Path::new(CKPT)).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
    }

    /// Mid-epoch, other training data are refused, saying how they differ and
    /// what to do instead; at an epoch boundary they are a note; a checkpoint
    /// that does not record its data resumes as before.
    #[test]
    fn other_data_are_refused_mid_epoch_and_noted_at_an_epoch_boundary() {
        let saved = settings();
        let mid = Position { epoch: 2, step: 5 };
        let boundary = Position { epoch: 3, step: 0 };
        let on = |data: Option<DataFingerprint>| Settings { data, ..settings() };
        let check = |saved: &Settings, now: Settings, at: Position| {
            compatibility(saved, &now, at, Path::new(CKPT)).map_err(|e| e.to_string())
        };
        let fewer = DataFingerprint {
            samples: 256,
            ..DATA
        };
        let other = DataFingerprint { hash: 7, ..DATA };
        let err = check(&saved, on(Some(fewer)), mid).unwrap_err();
        assert_eq!(
            err,
            "the checkpoint was saved mid-epoch (epoch 2, step 5) on other training data than this run's: it was trained on 512 samples, this run has 256; its position is a place in that data's shuffled order. Resume it with the data it was saved with, or start from its weights with --init-from ckpt/ckpt-e0002-s000005/model.safetensors and a new --checkpoint-dir (a fresh epoch 1 and optimizer)"
        );
        let err = check(&saved, on(Some(other)), mid).unwrap_err();
        assert!(
            err.contains(
                "the same number of samples (512) but different contents (data fingerprint 00c0ffee00000001, this run's 0000000000000007)"
            ),
            "{err}"
        );
        let notes = check(&saved, on(Some(fewer)), boundary).unwrap();
        assert_eq!(
            notes,
            [
                "this run's training data differ from the checkpoint's (it was trained on 512 samples, this run has 256); it was saved at an epoch boundary, so epoch 3 starts on this run's data"
            ]
        );
        // Written before data fingerprints: no check, a note mid-epoch.
        let old = on(None);
        let notes = check(&old, on(Some(fewer)), mid).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("does not record its training data"),
            "{notes:?}"
        );
        assert_eq!(check(&old, on(Some(other)), boundary), Ok(vec![]));
    }
}
