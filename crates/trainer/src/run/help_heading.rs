//! The headings of `trainer --help`, each flag under one: a flag group
//! takes its heading where it is flattened (`job.rs`, `cli/`), a flag of a
//! group split between two headings names its own.

pub const LAUNCHING: &str = "Launching and rendezvous";
pub const MODEL: &str = "Model and data";
pub const TRAINING: &str = "Training";
pub const DEVICES: &str = "Devices and precision";
pub const COMMUNICATION: &str = "Communication";
pub const CHECKPOINTS: &str = "Checkpoints and resume";
pub const OBSERVABILITY: &str = "Observability";

/// Every heading, in the order `--help` shows them (that of each one's
/// first flag).
pub const ALL: [&str; 7] = [
    LAUNCHING,
    MODEL,
    TRAINING,
    DEVICES,
    COMMUNICATION,
    CHECKPOINTS,
    OBSERVABILITY,
];
