//! `--flight-recorder DIR`: where a rank writes the last collectives of
//! its communicators (`comm::flight`) when it fails, times out, or gets
//! SIGUSR2, for the launcher's verdict on a hang.

use std::path::{Path, PathBuf};

use clap::Args;

/// The flight recorder's flag.
#[derive(Clone, Debug, Default, Args)]
pub struct FlightFlags {
    /// Where each rank writes its flight record.
    ///
    /// Its communicators' last 256 collectives, as rank-R.json, when it
    /// fails, a collective times out, or it gets SIGUSR2 [default:
    /// CHECKPOINT_DIR/flight-recorder, else trainer-flight-recorder-ID in the
    /// temp dir].
    #[arg(long, value_name = "DIR")]
    pub flight_recorder: Option<PathBuf>,
}

impl FlightFlags {
    /// The directory: the flag's, else in `checkpoint_dir`, else in the
    /// temp dir, named for `job` (a launcher's pid, the job's port: alike
    /// on the ranks of one machine, unlike another job's there).
    pub fn dir(&self, checkpoint_dir: Option<&Path>, job: impl std::fmt::Display) -> PathBuf {
        match (&self.flight_recorder, checkpoint_dir) {
            (Some(dir), _) => dir.clone(),
            (None, Some(ckpt)) => ckpt.join("flight-recorder"),
            (None, None) => std::env::temp_dir().join(format!("trainer-flight-recorder-{job}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_is_the_flags_else_beside_the_checkpoints_else_temporary() {
        let given = FlightFlags {
            flight_recorder: Some("/x/fr".into()),
        };
        assert_eq!(given.dir(Some(Path::new("/ck")), 7), Path::new("/x/fr"));
        let default = FlightFlags::default();
        assert_eq!(
            default.dir(Some(Path::new("/ck")), 7),
            Path::new("/ck/flight-recorder")
        );
        let tmp = default.dir(None, 29500);
        assert!(tmp.starts_with(std::env::temp_dir()), "{}", tmp.display());
        assert!(tmp.ends_with("trainer-flight-recorder-29500"));
    }
}
