//! The flight recorder, as PyTorch's: every communicator keeps its last
//! [`CAPACITY`] collectives (sequence number, kind, gradient bucket,
//! bytes, how far each got and when) in a [`Recorder`], cheap enough to
//! stay on: no lock and no allocation per collective. A rank's
//! [`FlightLog`] dumps them all as one small JSON file ([`RankRecord`])
//! when the rank fails, times out or is asked (SIGUSR2), so that the
//! launcher can say which rank never arrived, at which collective.

mod log;
mod record;
mod recorder;

pub use log::FlightLog;
pub use record::{Entry, GroupRecord, Kind, RankRecord, State, record_path, unix_micros};
pub use recorder::{CAPACITY, Recorder};

/// What a queued NCCL collective is called in errors (`name`), and the
/// gradient bucket it averages, if any, for its flight record.
#[derive(Clone, Copy, Debug)]
pub struct Label<'a> {
    pub name: &'a str,
    pub bucket: Option<usize>,
}

impl<'a> Label<'a> {
    /// The all-reduce of gradient bucket `bucket`, called `name`.
    pub fn bucket(name: &'a str, bucket: usize) -> Self {
        Self {
            name,
            bucket: Some(bucket),
        }
    }
}

impl<'a> From<&'a str> for Label<'a> {
    fn from(name: &'a str) -> Self {
        Self { name, bucket: None }
    }
}
