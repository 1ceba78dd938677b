//! How a run sums its gradients, as its checkpoints record it: a run of the
//! other kind cannot continue one of its epochs with the same meaning.

use std::fmt;

use anyhow::anyhow;

/// The metadata key of [`Summation`].
pub(super) const KEY: &str = "summation";

/// How the replicas' gradients become a step's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Summation {
    /// Each rank's batch, averaged over the ranks in float32 (the default;
    /// checkpoints from before it was recorded).
    Ring,
    /// `--reproducible`: global batches of `global_batch` samples in units
    /// of `unit`, summed exactly (`crate::train::exact`).
    Exact { global_batch: usize, unit: usize },
}

impl fmt::Display for Summation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Summation::Ring => f.write_str("ring"),
            Summation::Exact { global_batch, unit } => write!(f, "exact:{global_batch}:{unit}"),
        }
    }
}

impl Summation {
    /// The value a checkpoint's metadata holds under [`KEY`] (`None`: a
    /// checkpoint from before it was recorded).
    pub(super) fn from_metadata(value: Option<&String>) -> anyhow::Result<Self> {
        let Some(value) = value else {
            return Ok(Summation::Ring);
        };
        let exact = || {
            let (b, m) = value.strip_prefix("exact:")?.split_once(':')?;
            let (global_batch, unit) = (b.parse().ok()?, m.parse().ok()?);
            (unit > 0 && global_batch > 0).then_some(Summation::Exact { global_batch, unit })
        };
        match value.as_str() {
            "ring" => Ok(Summation::Ring),
            _ => exact().ok_or_else(|| anyhow!("metadata `{KEY}` = {value:?} is not valid")),
        }
    }

    /// The flags that train this way, for a message.
    pub fn flags(&self) -> String {
        match self {
            Summation::Ring => "without --reproducible".into(),
            Summation::Exact { global_batch, unit } => {
                format!("--reproducible --global-batch {global_batch} --unit {unit}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_round_trips_through_the_metadata_and_refuses_garbage() {
        for s in [
            Summation::Ring,
            Summation::Exact {
                global_batch: 128,
                unit: 16,
            },
        ] {
            assert_eq!(Summation::from_metadata(Some(&s.to_string())).unwrap(), s);
        }
        assert_eq!(Summation::from_metadata(None).unwrap(), Summation::Ring);
        for bad in ["exact:128", "exact:0:16", "exact:a:b", "sum"] {
            assert!(
                Summation::from_metadata(Some(&bad.to_string())).is_err(),
                "{bad}"
            );
        }
    }
}
