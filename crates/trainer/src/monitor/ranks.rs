//! Every rank's epoch (its [`Usage`] and where its time went) as a fixed
//! row of f64 slots: each rank fills its own row of a zeroed table and one
//! exact all-reduce sum hands rank 0 every row.

use serde::Serialize;

use super::{GpuUsage, Summary, Usage};
use crate::phases::{Phase, PhaseSeconds};

/// One rank's epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RankStats {
    pub usage: Usage,
    /// Training time per step phase, in device time (see `train::timer`).
    pub phases: PhaseSeconds,
    /// The test-set pass.
    pub eval_seconds: f64,
    /// Bytes the rank sent per step averaging gradients (see
    /// `ddp::ring_bytes`).
    pub grad_bytes_per_step: f64,
}

/// Six summaries of four slots (present, min, mean, max), the phases,
/// eval, gradient bytes.
const SUMMARIES: usize = 6;
const SLOTS: usize = SUMMARIES * 4 + Phase::ALL.len() + 2;

impl RankStats {
    /// Training seconds other than waiting for the peers' gradients or
    /// for the other pipeline stage: what makes a rank slow rather than
    /// kept waiting.
    pub fn busy_seconds(&self) -> f64 {
        self.phases.0.iter().sum::<f64>()
            - self.phases.get(Phase::AllReduceWait)
            - self.phases.get(Phase::PipelineWait)
    }

    /// A `world_size`-row table, zero but for this rank's row.
    pub fn table_row(&self, rank: usize, world_size: usize) -> Vec<f64> {
        let mut table = vec![0.0; SLOTS * world_size];
        let row = &mut table[rank * SLOTS..(rank + 1) * SLOTS];
        let gpu = self.usage.gpu;
        let summaries = [
            self.usage.rss_mib,
            self.usage.cpu_percent,
            gpu.map(|g| g.util_percent),
            gpu.map(|g| g.memory_mib),
            gpu.map(|g| g.power_w),
            gpu.map(|g| g.temperature_c),
        ];
        for (slots, summary) in row.chunks_mut(4).zip(summaries) {
            if let Some(s) = summary {
                slots.copy_from_slice(&[1.0, s.min, s.mean, s.max]);
            }
        }
        let times = &mut row[SUMMARIES * 4..];
        times[..Phase::ALL.len()].copy_from_slice(&self.phases.0);
        times[Phase::ALL.len()] = self.eval_seconds;
        times[Phase::ALL.len() + 1] = self.grad_bytes_per_step;
        table
    }

    /// Every rank's stats from the summed table.
    pub fn from_table(table: &[f64]) -> Vec<RankStats> {
        table.chunks_exact(SLOTS).map(Self::from_row).collect()
    }

    fn from_row(row: &[f64]) -> RankStats {
        let summary = |i: usize| {
            let s = &row[i * 4..i * 4 + 4];
            (s[0] == 1.0).then(|| Summary {
                min: s[1],
                mean: s[2],
                max: s[3],
            })
        };
        let gpu = GpuUsage::from_parts([summary(2), summary(3), summary(4), summary(5)]);
        let times = &row[SUMMARIES * 4..];
        let mut phases = PhaseSeconds::default();
        phases.0.copy_from_slice(&times[..Phase::ALL.len()]);
        RankStats {
            usage: Usage {
                rss_mib: summary(0),
                cpu_percent: summary(1),
                gpu,
            },
            phases,
            eval_seconds: times[Phase::ALL.len()],
            grad_bytes_per_step: times[Phase::ALL.len() + 1],
        }
    }
}

/// A rank more than 10% behind the median in busy time.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Straggler {
    pub rank: usize,
    /// Its busy seconds over the median's.
    pub ratio: f64,
}

impl Straggler {
    /// How far behind the median the slowest rank may be before it is named.
    pub const TOLERANCE: f64 = 1.1;

    /// The slowest of `ranks` against its peers, when it is a straggler:
    /// rank `r`'s peers are the ranks `r mod groups` (pipeline stages do
    /// different work, so stage `s` is compared with stage `s` only; one
    /// group for plain data parallelism).
    pub fn find(ranks: &[RankStats], groups: usize) -> Option<Straggler> {
        let groups = groups.max(1);
        (0..groups)
            .filter_map(|g| {
                let members: Vec<usize> = (g..ranks.len()).step_by(groups).collect();
                let busy: Vec<f64> = members.iter().map(|&r| ranks[r].busy_seconds()).collect();
                Self::slowest(&busy).map(|(i, ratio)| Straggler {
                    rank: members[i],
                    ratio,
                })
            })
            .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
    }

    /// The index and ratio to the median of the largest of `busy`, when
    /// past the tolerance.
    fn slowest(busy: &[f64]) -> Option<(usize, f64)> {
        let (index, slowest) = busy
            .iter()
            .copied()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(&b.1))?;
        let mut sorted = busy.to_vec();
        sorted.sort_by(f64::total_cmp);
        let n = sorted.len();
        let median = (sorted[(n - 1) / 2] + sorted[n / 2]) / 2.0;
        let ratio = slowest / median;
        (median > 0.0 && ratio > Self::TOLERANCE).then_some((index, ratio))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(busy: f64) -> RankStats {
        RankStats {
            usage: Usage {
                rss_mib: Some(Summary {
                    min: 100.0,
                    mean: 110.0,
                    max: 120.0,
                }),
                cpu_percent: None,
                gpu: None,
            },
            phases: PhaseSeconds([0.1, busy, 0.0, 2.0, 0.0, 0.0]),
            eval_seconds: 0.5,
            grad_bytes_per_step: 3.6e6,
        }
    }

    #[test]
    fn rows_summed_over_ranks_give_every_rank_back() {
        let ranks = [stats(1.0), stats(2.0), stats(3.0)];
        let mut table = vec![0.0; 0];
        for (rank, s) in ranks.iter().enumerate() {
            let row = s.table_row(rank, ranks.len());
            table = if table.is_empty() {
                row
            } else {
                table.iter().zip(row).map(|(a, b)| a + b).collect()
            };
        }
        assert_eq!(RankStats::from_table(&table), ranks);
    }

    #[test]
    fn the_straggler_is_named_past_ten_percent_of_the_median() {
        assert_eq!(
            Straggler::find(&[stats(1.0), stats(1.05), stats(1.0)], 1),
            None
        );
        let found = Straggler::find(&[stats(1.0), stats(1.0), stats(1.9)], 1).unwrap();
        assert_eq!(found.rank, 2);
        assert!((found.ratio - 2.0 / 1.1).abs() < 1e-12, "{found:?}");
        assert_eq!(Straggler::find(&[stats(1.0)], 1), None);
        assert_eq!(Straggler::find(&[], 1), None);
    }

    /// Two pipelines of two stages: the stages differ by far, which is no
    /// straggler; one stage behind its twin in the other pipeline is.
    #[test]
    fn pipeline_stages_are_compared_with_their_own_stage() {
        let even = [stats(1.0), stats(3.0), stats(1.0), stats(3.0)];
        assert!(
            Straggler::find(&even, 1).is_some(),
            "across stages: a false straggler"
        );
        assert_eq!(Straggler::find(&even, 2), None);
        let slow = [stats(1.0), stats(3.0), stats(1.0), stats(6.0)];
        assert_eq!(Straggler::find(&slow, 2).map(|s| s.rank), Some(3));
    }

    /// A stage kept waiting by the other stage of its pipeline (a slow
    /// twin there) is not slow itself.
    #[test]
    fn waiting_for_the_other_stage_is_not_slowness() {
        let waiting = |wait: f64| RankStats {
            phases: PhaseSeconds([0.1, 1.0, 1.0, 0.0, 0.1, wait]),
            ..stats(0.0)
        };
        let ranks = [waiting(0.0), stats(1.0), waiting(5.0), stats(1.0)];
        assert_eq!(Straggler::find(&ranks, 2), None);
    }
}
