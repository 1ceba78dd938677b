//! What can stop a launcher, as values: the messages name the flag, node,
//! host or port involved and the fix; a cause from the OS or the store
//! stays reachable as the error's source (so a program can still tell a
//! lost peer from a refusal, see [`crate::contract::failure_exit_code`]).

use comm::{AuthTokenError, CommError};

/// Why a launcher could not run its share of the job.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The flags or launch variables do not describe a job.
    #[error("{0}")]
    Flags(String),
    /// The launchers of the job's machines could not meet, or one lost the
    /// others.
    #[error("{0}")]
    Rendezvous(String),
    /// The launchers' store, or the job's auth token, failed while the
    /// launcher was `doing` something.
    #[error("{doing}")]
    Store {
        doing: String,
        #[source]
        cause: CommError,
    },
    /// The OS refused what the launcher was `doing`.
    #[error("{doing}")]
    Os {
        doing: String,
        #[source]
        cause: std::io::Error,
    },
    /// The workers failed, and no restart was left or could help.
    #[error("{0}")]
    WorkersFailed(String),
    /// The workers' program refused the job before its first start
    /// ([`crate::Restarts::hold`]).
    #[error(transparent)]
    Refused(Refusal),
}

/// Why the workers' program refuses to run the job
/// ([`crate::Restarts::hold`]).
pub type Refusal = Box<dyn std::error::Error + Send + Sync>;

/// A store request that failed outside any named step.
impl From<CommError> for LaunchError {
    fn from(cause: CommError) -> Self {
        LaunchError::Store {
            doing: "the launchers' store".to_string(),
            cause,
        }
    }
}

/// Names what a failing call was doing, as anyhow's `with_context` does,
/// for the causes a launcher meets.
pub(crate) trait Doing<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, LaunchError>;
}

impl<T> Doing<T> for Result<T, CommError> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, LaunchError> {
        self.map_err(|cause| LaunchError::Store {
            doing: what(),
            cause,
        })
    }
}

impl<T> Doing<T> for Result<T, AuthTokenError> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, LaunchError> {
        self.map_err(CommError::from).doing(what)
    }
}

impl<T> Doing<T> for std::io::Result<T> {
    fn doing(self, what: impl FnOnce() -> String) -> Result<T, LaunchError> {
        self.map_err(|cause| LaunchError::Os {
            doing: what(),
            cause,
        })
    }
}

/// Returns a [`LaunchError`] of `kind` with a formatted message.
macro_rules! refuse {
    ($kind:ident, $($message:tt)*) => {
        return Err($crate::error::LaunchError::$kind(format!($($message)*)))
    };
}
