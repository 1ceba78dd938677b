//! The settings every rank of a job must hold alike, as one typed value:
//! with another `--lr` or `--no-dropout` a rank would train another model
//! without a word, with other `--epochs`, `--max-steps` or
//! `--checkpoint-every` it would call collectives the others never call.
//! Ranks compare theirs with rank 0's (`==`, agreement.rs) before anything
//! else travels, and a checkpoint records rank 0's as they are (the state
//! file's `shared_settings`, `checkpoint::shared_record`), so that a
//! resumed run names each flag it changed.
//! Per-rank choices (`--device`, `--threads`, paths, rank 0's outputs) are
//! not among them.
//!
//! Each field is named after its flag (`batch_size`: `--batch-size`), so
//! that a difference is told in the flags' own words.

use core_tensor::MatmulPrecision;
use serde::{Deserialize, Serialize};

use crate::checkpoint::shared_record::{self, Difference, SharedRecord};
use crate::ddp::{BackendChoice, CommHookChoice, SparseGrads};

/// What every rank of a job must hold alike.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedSettings {
    #[serde(flatten)]
    pub model: ModelSettings,
    #[serde(flatten)]
    pub schedule: ScheduleSettings,
    #[serde(flatten)]
    pub gradients: GradientSettings,
    #[serde(flatten)]
    pub layout: LayoutSettings,
}

/// The model and the samples it learns and is tested on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelSettings {
    /// `--model`, by the name the model registry (`crate::models`, a layer
    /// above this one) gives it.
    pub model: String,
    pub no_dropout: bool,
    pub eval_samples: Option<usize>,
    pub samples: Option<u64>,
    pub embedding_dim: Option<u32>,
}

/// How long it trains, in which steps, with which optimizer settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleSettings {
    pub epochs: u32,
    pub batch_size: u32,
    pub lr: f64,
    pub seed: u64,
    pub max_steps: Option<u32>,
    pub accumulate_steps: u32,
    pub reproducible: bool,
    pub global_batch: Option<u32>,
    pub unit: u32,
    pub sparse_adam: bool,
}

/// How the gradients are made and travel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GradientSettings {
    pub bucket_mb: f64,
    #[serde(with = "as_text")]
    pub comm_hook: CommHookChoice,
    pub sparse_grads: SparseGrads,
    pub backend: BackendChoice,
    #[serde(with = "as_text")]
    pub precision: MatmulPrecision,
}

/// Where the ranks meet besides the gradients: checkpoints (every rank
/// takes part in each save) and the pipeline's cut.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayoutSettings {
    /// Whether `--checkpoint-dir` is given (its path is rank 0's alone).
    pub checkpoint_dir: bool,
    pub checkpoint_every: Option<u64>,
    pub pipeline_stages: u32,
    pub micro_batches: Option<u32>,
}

impl SharedSettings {
    /// The flags whose values differ between `self` and `other`, by name.
    pub fn differences(&self, other: &SharedSettings) -> Vec<Difference> {
        shared_record::differences(&self.record(), &other.record())
    }

    /// As a checkpoint records it.
    pub fn record(&self) -> SharedRecord {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => unreachable!("a struct of plain fields serializes to an object"),
        }
    }
}

/// A value that travels as its flag's text (`Display` and `FromStr`).
mod as_text {
    use std::fmt::Display;
    use std::str::FromStr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<T: Display, S: Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(value)
    }

    pub fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr<Err: Display>,
        D: Deserializer<'de>,
    {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> SharedSettings {
        SharedSettings {
            model: ModelSettings {
                model: "cnn".into(),
                no_dropout: false,
                eval_samples: None,
                samples: None,
                embedding_dim: None,
            },
            schedule: ScheduleSettings {
                epochs: 5,
                batch_size: 64,
                lr: 1e-3,
                seed: 0,
                max_steps: None,
                accumulate_steps: 1,
                reproducible: false,
                global_batch: None,
                unit: 16,
                sparse_adam: false,
            },
            gradients: GradientSettings {
                bucket_mb: 25.0,
                comm_hook: CommHookChoice::None,
                sparse_grads: SparseGrads::Auto,
                backend: BackendChoice::Auto,
                precision: MatmulPrecision::Fp32,
            },
            layout: LayoutSettings {
                checkpoint_dir: false,
                checkpoint_every: None,
                pipeline_stages: 1,
                micro_batches: None,
            },
        }
    }

    /// The record read back as the agreement reads rank 0's settings.
    fn from_record(record: &SharedRecord) -> Option<SharedSettings> {
        serde_json::from_value(serde_json::Value::Object(record.clone())).ok()
    }

    #[test]
    fn settings_survive_their_record_and_differences_are_told_as_flags() {
        let base = defaults();
        let mut other = base.clone();
        other.schedule.lr = 0.1;
        other.gradients.comm_hook = CommHookChoice::PowerSgd { rank: 4, start: 10 };
        other.gradients.precision = MatmulPrecision::Bf16;
        other.layout.checkpoint_dir = true;
        other.schedule.max_steps = Some(30);
        other.gradients.sparse_grads = SparseGrads::Never;
        assert_eq!(from_record(&other.record()), Some(other.clone()));
        assert_eq!(from_record(&base.record()), Some(base.clone()));
        let told: Vec<_> = (base.differences(&other).into_iter())
            .map(|d| format!("{} {} {}", d.flag, d.values[0], d.values[1]))
            .collect();
        assert_eq!(
            told,
            [
                "--checkpoint-dir not given given",
                "--comm-hook none powersgd:4:10",
                "--lr 0.001 0.1",
                "--max-steps (not given) 30",
                "--precision f32 bf16",
                "--sparse-grads auto never",
            ]
        );
        assert!(base.differences(&base.clone()).is_empty());
        // A value the flag would refuse is refused in the JSON too.
        let mut bad = base.record();
        bad.insert("comm_hook".into(), "powersgd:0".into());
        assert_eq!(from_record(&bad), None);
    }
}
