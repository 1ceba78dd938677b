//! Stop requests: what a signal asks of a running rank.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

/// What a stop request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopKind {
    /// SIGTERM, SIGUSR1: stop at a step all ranks agree on, save, exit
    /// [`PREEMPTED_EXIT_CODE`].
    Preempt,
    /// SIGINT, SIGHUP: stop promptly.
    Interrupt,
}

/// Cheap to clone (an `Arc`'d atomic); checked once per training step.
#[derive(Clone, Debug, Default)]
pub struct StopRequest(Arc<AtomicU8>);

const NONE: u8 = 0;
const PREEMPT: u8 = 1;
const INTERRUPT: u8 = 2;

impl StopRequest {
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks for a stop; an interrupt overrides a preemption, never the
    /// other way round.
    pub fn request(&self, kind: StopKind) {
        let value = match kind {
            StopKind::Preempt => PREEMPT,
            StopKind::Interrupt => INTERRUPT,
        };
        self.0.fetch_max(value, Ordering::AcqRel);
    }

    /// The stop asked for so far, if any: one atomic load.
    pub fn requested(&self) -> Option<StopKind> {
        match self.0.load(Ordering::Acquire) {
            NONE => None,
            PREEMPT => Some(StopKind::Preempt),
            _ => Some(StopKind::Interrupt),
        }
    }
}

/// The exit code of a rank that stopped on a preemption request
/// (`EX_TEMPFAIL`: try again later, with `--resume auto`).
pub const PREEMPTED_EXIT_CODE: i32 = 75;
