//! One live recovery (`--recovery live`) as rank 0 of the new generation
//! reports it: a line, a row of the metrics file, TensorBoard scalars.

use serde::Serialize;

/// What a live recovery changed, and what it took.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecoveryEvent {
    /// Always `"live_recovery"`: tells the row from an epoch's.
    pub event: &'static str,
    pub generation: u64,
    pub world_size: usize,
    /// The global step the new generation goes on after.
    pub after_global_step: u64,
    /// The ranks (as their launchers gave them) lost, and joined.
    pub lost: Vec<usize>,
    pub joined: Vec<usize>,
    /// The error that ended the generation before, or why it ended.
    pub cause: String,
    /// From the end of the generation before, on rank 0, to the ranks
    /// healed (the failure's detection not included: a killed peer is
    /// seen at once, a stopped one after `--timeout`).
    pub seconds: f64,
    /// The bytes rank 0's heal broadcast sent each rank in those seconds
    /// (parameters, Adam's moments, the position, the epoch's numbers):
    /// what a joining rank received to catch up.
    pub heal_bytes: u64,
}

impl RecoveryEvent {
    /// The event's value of [`RecoveryEvent::event`].
    pub const KIND: &'static str = "live_recovery";

    /// The log line.
    pub fn line(&self) -> String {
        let list = |slots: &[usize]| {
            let named: Vec<String> = slots.iter().map(usize::to_string).collect();
            named.join(", ")
        };
        let what = match (self.lost.is_empty(), self.joined.is_empty()) {
            (false, true) => format!("lost rank(s) launched as {}", list(&self.lost)),
            (true, false) => format!("joined: rank(s) launched as {}", list(&self.joined)),
            (false, false) => format!(
                "lost rank(s) launched as {}, joined: {}",
                list(&self.lost),
                list(&self.joined)
            ),
            (true, true) => "the same ranks formed again".to_string(),
        };
        format!(
            "live recovery: {what}; generation {}: {} rank(s), going on after global step {}; {:.2} s to the ranks healed with {:.1} MB each (generation {} ended: {})",
            self.generation,
            self.world_size,
            self.after_global_step,
            self.seconds,
            self.heal_bytes as f64 / 1e6,
            self.generation - 1,
            self.cause
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A join's row and line carry the heal's bytes beside its seconds.
    #[test]
    fn a_join_reports_the_bytes_that_healed_it() {
        let event = RecoveryEvent {
            event: RecoveryEvent::KIND,
            generation: 3,
            world_size: 4,
            after_global_step: 44,
            lost: vec![2],
            joined: vec![2],
            cause: "newcomers waited".into(),
            seconds: 0.15,
            heal_bytes: 14_398_720,
        };
        let row = serde_json::to_value(&event).unwrap();
        assert_eq!(row["event"], "live_recovery");
        assert_eq!(row["heal_bytes"], 14_398_720);
        assert_eq!(row["seconds"], 0.15);
        let line = event.line();
        assert!(
            line.contains("lost rank(s) launched as 2, joined: 2")
                && line.contains("healed with 14.4 MB each (generation 2 ended"),
            "{line}"
        );
    }
}
