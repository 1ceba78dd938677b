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
            "live recovery: {what}; generation {}: {} rank(s), going on after global step {}; {:.2} s to the ranks healed (generation {} ended: {})",
            self.generation,
            self.world_size,
            self.after_global_step,
            self.seconds,
            self.generation - 1,
            self.cause
        )
    }
}
