//! The training state a checkpoint holds, and its two files.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;

use anyhow::{Context, anyhow, bail};
use core_tensor::FlatLayout;

use super::Position;
use super::files::{self, Checksum, Named};
use super::hook_state::{self, HOOK_FILE, HOOK_SUM, HookState};
use super::shared_record::SharedRecord;
use super::summation::{self, Summation};
use crate::bounded_read;
use crate::data::DataFingerprint;
use crate::model::DropoutRates;

pub const MODEL_FILE: &str = "model.safetensors";
pub const STATE_FILE: &str = "state.safetensors";
/// Bumped when the files change meaning; older builds then refuse them.
const FORMAT_VERSION: u32 = 1;
const EXP_AVG: &str = "exp_avg.";
const EXP_AVG_SQ: &str = "exp_avg_sq.";
const LOSS_SUM: &str = "epoch_loss_sum";
const CORRECT: &str = "epoch_correct";
/// The metadata key of [`Settings::data`].
const DATA: &str = "data_fingerprint";
/// The metadata key of [`Settings::pipeline_stages`].
const STAGES: &str = "pipeline_stages";
/// The metadata keys of [`Settings::accumulate_steps`] and
/// [`Settings::comm_hook`].
const ACCUMULATE: &str = "accumulate_steps";
const COMM_HOOK: &str = "comm_hook";
/// The metadata key of [`Settings::shared`].
const SHARED: &str = "shared_settings";

/// The settings a run trains with that a checkpoint records.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub seed: u64,
    pub world_size: usize,
    /// Stages per pipeline (1: every rank a data-parallel replica); the
    /// world holds `world_size / pipeline_stages` replicas, whose shards
    /// of an epoch depend on that number. Checkpoints from before it was
    /// recorded are data parallel.
    pub pipeline_stages: usize,
    /// Samples per micro-batch on each rank.
    pub batch_size: usize,
    /// Micro-batches per optimizer step (`--accumulate-steps`; checkpoints
    /// from before it was recorded: 1). A position counts optimizer steps,
    /// so a checkpoint never falls between micro-batches.
    pub accumulate_steps: usize,
    /// `--comm-hook`, as it prints (checkpoints from before it was
    /// recorded: `none`).
    pub comm_hook: String,
    pub lr: f64,
    pub dropout: DropoutRates,
    /// The model's `--model` name (checkpoints from before it was
    /// recorded are the CNN's).
    pub model: String,
    /// The training data's identity; `None` (unknown) in checkpoints from
    /// before it was recorded.
    pub data: Option<DataFingerprint>,
    pub summation: Summation,
    /// Every flag the job's ranks shared, as rank 0 held them
    /// (`train::SharedSettings`); `None` in checkpoints from before they
    /// were recorded, and from ranks built in one program.
    pub shared: Option<SharedRecord>,
}

impl Settings {
    /// Data-parallel replicas: the ranks an epoch's samples are shared out
    /// over.
    pub fn replicas(&self) -> usize {
        self.world_size / self.pipeline_stages
    }
}

/// The trainer's flag defaults on one rank (`--model cnn`, seed 0, batch
/// 64, lr 1e-3, the reference dropout) and unknown data, as a checkpoint
/// from before data fingerprints records them: a base to vary.
impl Default for Settings {
    fn default() -> Self {
        Settings {
            seed: 0,
            world_size: 1,
            pipeline_stages: 1,
            batch_size: 64,
            accumulate_steps: 1,
            comm_hook: "none".into(),
            lr: 1e-3,
            dropout: DropoutRates::REFERENCE,
            model: "cnn".into(),
            data: None,
            summation: Summation::Ring,
            shared: None,
        }
    }
}

/// Everything needed to continue training exactly where it stopped.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainingState {
    pub position: Position,
    /// Adam updates done (its bias correction depends on it).
    pub optimizer_step: u64,
    pub params: Vec<f32>,
    /// Adam's first and second moments, laid out like `params`.
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
    /// Each rank's running loss sum and correct count in the current epoch
    /// (zero at an epoch boundary), so the epoch's numbers come out the same.
    pub epoch_loss_sum: Vec<f32>,
    pub epoch_correct: Vec<f32>,
    /// Rank 0's training time so far in the current epoch.
    pub epoch_train_seconds: f64,
    /// Samples of the epoch's shuffled order visited so far, where an
    /// earlier layout began the epoch; `None`: `step x batch x K x replicas`,
    /// the epoch having run in this layout throughout (not recorded then).
    pub epoch_visited: Option<u64>,
    pub settings: Settings,
    /// `--comm-hook powersgd`'s state, once it has compressed a step.
    pub hook: Option<HookState>,
}

/// The metadata key of [`TrainingState::epoch_visited`].
const VISITED: &str = "epoch_visited";

impl TrainingState {
    /// Samples of the epoch's shuffled order visited (see
    /// [`Self::epoch_visited`]).
    pub fn visited(&self) -> u64 {
        self.epoch_visited.unwrap_or_else(|| {
            let s = &self.settings;
            self.position.step * (s.batch_size * s.accumulate_steps * s.replicas()) as u64
        })
    }

    /// The name and contents of each file, model first.
    pub(super) fn encode(
        &self,
        layout: &FlatLayout,
    ) -> anyhow::Result<Vec<(&'static str, Vec<u8>)>> {
        if let Some(bad) = self.first_non_finite(layout) {
            bail!("refusing to write non-finite values ({bad})");
        }
        let model_meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        let (model, model_sum) =
            files::encode(&files::unflatten(layout, "", &self.params), model_meta)?;
        let s = &self.settings;
        let mut meta: HashMap<String, String> = [
            ("format_version", FORMAT_VERSION.to_string()),
            ("epoch", self.position.epoch.to_string()),
            ("step_in_epoch", self.position.step.to_string()),
            ("optimizer_step", self.optimizer_step.to_string()),
            ("seed", s.seed.to_string()),
            ("world_size", s.world_size.to_string()),
            (STAGES, s.pipeline_stages.to_string()),
            ("batch_size", s.batch_size.to_string()),
            (ACCUMULATE, s.accumulate_steps.to_string()),
            (COMM_HOOK, s.comm_hook.clone()),
            (summation::KEY, s.summation.to_string()),
            ("lr", s.lr.to_string()),
            ("model", s.model.clone()),
            (
                "dropout",
                format!("{},{}", s.dropout.pool, s.dropout.hidden),
            ),
            ("epoch_train_seconds", self.epoch_train_seconds.to_string()),
            ("model_sha256", model_sum),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if let Some(data) = s.data {
            meta.insert(DATA.to_string(), data.to_metadata());
        }
        if let Some(visited) = self.epoch_visited {
            meta.insert(VISITED.to_string(), visited.to_string());
        }
        if let Some(shared) = &s.shared {
            let json = serde_json::to_string(shared).context("writing the shared settings")?;
            meta.insert(SHARED.to_string(), json);
        }
        let hook = (self.hook.as_ref())
            .map(|h| h.encode(s.world_size))
            .transpose()?;
        if let Some((_, sum)) = &hook {
            meta.insert(HOOK_SUM.to_string(), sum.clone());
        }
        let mut tensors = files::unflatten(layout, EXP_AVG, &self.exp_avg);
        tensors.extend(files::unflatten(layout, EXP_AVG_SQ, &self.exp_avg_sq));
        for (name, values) in [
            (LOSS_SUM, &self.epoch_loss_sum),
            (CORRECT, &self.epoch_correct),
        ] {
            tensors.push(Named {
                name: name.to_string(),
                shape: vec![values.len()],
                values,
            });
        }
        let (state, _) = files::encode(&tensors, meta)?;
        let mut files = vec![(MODEL_FILE, model), (STATE_FILE, state)];
        files.extend(hook.map(|(bytes, _)| (HOOK_FILE, bytes)));
        Ok(files)
    }

    /// Names the first tensor holding a NaN or an infinity, if any.
    fn first_non_finite(&self, layout: &FlatLayout) -> Option<String> {
        let flat = [
            ("", &self.params),
            (EXP_AVG, &self.exp_avg),
            (EXP_AVG_SQ, &self.exp_avg_sq),
        ];
        for (prefix, values) in flat {
            if let Some(v) = layout
                .views()
                .iter()
                .find(|v| values[v.range.clone()].iter().any(|x| !x.is_finite()))
            {
                return Some(format!("{prefix}{}", v.spec.name));
            }
        }
        if self.hook.as_ref().is_some_and(|h| !h.is_finite()) {
            return Some(HOOK_FILE.to_string());
        }
        [
            (LOSS_SUM, &self.epoch_loss_sum),
            (CORRECT, &self.epoch_correct),
        ]
        .into_iter()
        .find(|(_, values)| values.iter().any(|x| !x.is_finite()))
        .map(|(name, _)| name.to_string())
    }
}

/// Reads and validates the checkpoint directory `dir`.
pub fn load(dir: &Path, layout: &FlatLayout) -> anyhow::Result<TrainingState> {
    if !dir.exists() {
        bail!("there is nothing at this path");
    }
    if !dir.is_dir() {
        bail!(
            "not a checkpoint directory (one holds {MODEL_FILE} and {STATE_FILE}); for weights alone use --init-from"
        );
    }
    if !dir.join(MODEL_FILE).exists() && !dir.join(STATE_FILE).exists() {
        bail!(
            "no {MODEL_FILE} or {STATE_FILE} here; for the newest checkpoint in a directory use --checkpoint-dir DIR --resume auto"
        );
    }
    let read = |name: &str, copies: u64, what: &str| {
        bounded_read::read(&dir.join(name), files::file_limit(layout, copies), what)
            .with_context(|| format!("reading {name}"))
    };
    let model_bytes = read(MODEL_FILE, 1, "this model's weights")?;
    let state_bytes = read(STATE_FILE, 2, "this model's Adam moments")?;
    let model = files::parse(&model_bytes, Checksum::Required).context(MODEL_FILE)?;
    let state = files::parse(&state_bytes, Checksum::Required).context(STATE_FILE)?;
    let meta = Meta(&state.metadata);
    let version: u32 = meta.get("format_version")?;
    if version != FORMAT_VERSION {
        bail!("{STATE_FILE}: format version {version}; this build reads version {FORMAT_VERSION}");
    }
    let settings = meta.settings()?;
    let params = model
        .tensors(&files::param_specs(layout, ""))
        .with_context(|| format!("{MODEL_FILE} (a checkpoint of --model {})", settings.model))?
        .concat();
    if model.metadata.get("sha256") != state.metadata.get("model_sha256") {
        bail!("{MODEL_FILE} is not the one {STATE_FILE} was written with (their checksums differ)");
    }
    let position = Position {
        epoch: meta.get("epoch")?,
        step: meta.get("step_in_epoch")?,
    };
    if position.epoch == 0 {
        bail!("{STATE_FILE}: epoch 0 (epochs count from 1)");
    }
    if let Some(named) = dir
        .file_name()
        .and_then(|n| Position::from_dir_name(&n.to_string_lossy()))
        && named != position
    {
        bail!("the directory's name says {named}, but {STATE_FILE} says {position}");
    }
    let mut specs = files::param_specs(layout, EXP_AVG);
    specs.extend(files::param_specs(layout, EXP_AVG_SQ));
    specs.extend([LOSS_SUM, CORRECT].map(|n| (n.to_string(), vec![settings.world_size])));
    let mut tensors = state.tensors(&specs).context(STATE_FILE)?.into_iter();
    let count = layout.views().len();
    let mut take = |n: usize| tensors.by_ref().take(n).collect::<Vec<_>>().concat();
    let (exp_avg, exp_avg_sq, epoch_loss_sum, epoch_correct) =
        (take(count), take(count), take(1), take(1));
    let hook = (state.metadata.get(HOOK_SUM))
        .map(|sum| hook_state::load(dir, sum, (settings.world_size, layout.len())))
        .transpose()?;
    let state = TrainingState {
        position,
        optimizer_step: meta.get("optimizer_step")?,
        params,
        exp_avg,
        exp_avg_sq,
        epoch_loss_sum,
        epoch_correct,
        epoch_train_seconds: meta.get("epoch_train_seconds")?,
        epoch_visited: match state.metadata.get(VISITED) {
            Some(_) => Some(meta.get(VISITED)?),
            None => None,
        },
        settings,
        hook,
    };
    state.check_values(layout)?;
    Ok(state)
}

/// Above this many Adam steps the bias correction's `f64` powers lose
/// whole steps (2^53); no real run gets near it.
const MAX_OPTIMIZER_STEP: u64 = 1 << 53;

impl TrainingState {
    /// What a checksum cannot vouch for: values no training writes (a
    /// checkpoint with a NaN weight would resume, and the first step would
    /// blame a gradient).
    fn check_values(&self, layout: &FlatLayout) -> anyhow::Result<()> {
        if let Some(bad) = self.first_non_finite(layout) {
            bail!("`{bad}` holds non-finite values; no run writes such a checkpoint");
        }
        let negative = |xs: &[f32]| xs.iter().any(|&x| x < 0.0);
        if negative(&self.epoch_loss_sum) || negative(&self.epoch_correct) {
            bail!("{STATE_FILE}: negative epoch loss sums or correct counts");
        }
        if !(self.epoch_train_seconds.is_finite() && self.epoch_train_seconds >= 0.0) {
            bail!(
                "{STATE_FILE}: metadata `epoch_train_seconds` = {} is not a time",
                self.epoch_train_seconds
            );
        }
        if self.optimizer_step > MAX_OPTIMIZER_STEP {
            bail!(
                "{STATE_FILE}: metadata `optimizer_step` = {} is past {MAX_OPTIMIZER_STEP}",
                self.optimizer_step
            );
        }
        let d = self.settings.dropout;
        if ![d.pool, d.hidden].iter().all(|p| (0.0..1.0).contains(p)) {
            bail!(
                "{STATE_FILE}: dropout rates {},{} are not in [0, 1)",
                d.pool,
                d.hidden
            );
        }
        Ok(())
    }
}

/// Typed access to a state file's metadata.
struct Meta<'a>(&'a HashMap<String, String>);

impl Meta<'_> {
    fn get<T: FromStr>(&self, key: &str) -> anyhow::Result<T> {
        let value = self
            .0
            .get(key)
            .ok_or_else(|| anyhow!("{STATE_FILE}: metadata has no `{key}`"))?;
        value
            .parse()
            .map_err(|_| anyhow!("{STATE_FILE}: metadata `{key}` = {value:?} is not valid"))
    }

    fn settings(&self) -> anyhow::Result<Settings> {
        let dropout: String = self.get("dropout")?;
        let (pool, hidden) = dropout
            .split_once(',')
            .and_then(|(p, h)| Some((p.parse().ok()?, h.parse().ok()?)))
            .ok_or_else(|| {
                anyhow!("{STATE_FILE}: metadata `dropout` = {dropout:?} is not valid")
            })?;
        let settings = Settings {
            seed: self.get("seed")?,
            world_size: self.get("world_size")?,
            pipeline_stages: match self.0.get(STAGES) {
                Some(_) => self.get(STAGES)?,
                None => 1,
            },
            batch_size: self.get("batch_size")?,
            accumulate_steps: match self.0.get(ACCUMULATE) {
                Some(_) => self.get(ACCUMULATE)?,
                None => 1,
            },
            comm_hook: self
                .0
                .get(COMM_HOOK)
                .cloned()
                .unwrap_or_else(|| "none".into()),
            lr: self.get("lr")?,
            dropout: DropoutRates { pool, hidden },
            model: self.0.get("model").cloned().unwrap_or_else(|| "cnn".into()),
            data: self
                .0
                .get(DATA)
                .map(|value| {
                    DataFingerprint::from_metadata(value).ok_or_else(|| {
                        anyhow!("{STATE_FILE}: metadata `{DATA}` = {value:?} is not valid")
                    })
                })
                .transpose()?,
            summation: Summation::from_metadata(self.0.get(summation::KEY))
                .map_err(|e| anyhow!("{STATE_FILE}: {e}"))?,
            shared: (self.0.get(SHARED))
                .map(|json| {
                    serde_json::from_str(json).map_err(|_| {
                        anyhow!("{STATE_FILE}: metadata `{SHARED}` is not a JSON object")
                    })
                })
                .transpose()?,
        };
        if settings.world_size == 0 || settings.batch_size == 0 || settings.accumulate_steps == 0 {
            bail!("{STATE_FILE}: world size, batch size and accumulate steps must be at least 1");
        }
        let stages = settings.pipeline_stages;
        if stages == 0 || !settings.world_size.is_multiple_of(stages) {
            bail!(
                "{STATE_FILE}: metadata `{STAGES}` = {stages} does not divide the world size {}",
                settings.world_size
            );
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::cnn::{CnnMnist, cnn_layout};

    #[test]
    fn a_state_with_a_non_finite_weight_or_a_negative_count_is_refused() {
        let params = CnnMnist::new(DropoutRates::REFERENCE).init_params(1);
        let mut state = TrainingState {
            position: Position { epoch: 1, step: 0 },
            optimizer_step: 3,
            exp_avg: vec![0.0; params.len()],
            exp_avg_sq: vec![0.0; params.len()],
            params,
            epoch_loss_sum: vec![1.0],
            epoch_correct: vec![2.0],
            epoch_train_seconds: 1.5,
            epoch_visited: None,
            settings: Settings::default(),
            hook: None,
        };
        state.check_values(cnn_layout()).unwrap();
        let fc1 = cnn_layout().range("fc1.weight").unwrap().start;
        state.params[fc1 + 7] = f32::NAN;
        let err = state.check_values(cnn_layout()).unwrap_err().to_string();
        assert!(
            err.contains("`fc1.weight` holds non-finite values"),
            "{err}"
        );
        state.params[fc1 + 7] = 0.0;
        state.epoch_correct[0] = -1e9;
        let err = state.check_values(cnn_layout()).unwrap_err().to_string();
        assert!(err.contains("negative"), "{err}");
    }
}
