//! How a job proves that a connection belongs to it: the user's choice at
//! the edge (a token file, the environment's token, or `--no-auth`) and
//! what it resolves to, carried by every configuration as one value, so
//! that a token beside a "no auth" cannot be written down.

use std::path::PathBuf;

use crate::auth::{AUTH_TOKEN_VAR, AuthToken, AuthTokenError};

/// Where the user said the job's token comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthChoice {
    /// A private file of 64 hex digits (`--auth-token-file`).
    File(PathBuf),
    /// [`AUTH_TOKEN_VAR`], if it is set (else none, or a launcher's fresh
    /// one).
    FromEnv,
    /// None, even where other machines reach the job (`--no-auth`).
    NoAuth,
}

impl AuthChoice {
    /// The choice the two flags make (clap refuses them together).
    pub fn of_flags(file: Option<PathBuf>, no_auth: bool) -> Self {
        match (file, no_auth) {
            (Some(file), _) => AuthChoice::File(file),
            (None, true) => AuthChoice::NoAuth,
            (None, false) => AuthChoice::FromEnv,
        }
    }

    /// Reads the token this choice names.
    pub fn resolve(&self) -> Result<Auth, AuthTokenError> {
        match self {
            AuthChoice::File(path) => AuthToken::from_file(path).map(Auth::Token),
            AuthChoice::NoAuth => Ok(Auth::Open),
            AuthChoice::FromEnv => match std::env::var(AUTH_TOKEN_VAR) {
                Ok(text) if !text.trim().is_empty() => {
                    AuthToken::from_hex(&text, AUTH_TOKEN_VAR).map(Auth::Token)
                }
                _ => Ok(Auth::Missing),
            },
        }
    }
}

/// What every store and ring connection of a job proves, or why nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    /// Both ends prove they hold the job's secret.
    Token(AuthToken),
    /// Nothing, as the user chose (`--no-auth`): any process that reaches
    /// the job's ports may join it.
    Open,
    /// Nothing, no token being given: allowed only where no other machine
    /// reaches the store ([`crate::CommConfig::validate`]).
    Missing,
}

impl Auth {
    /// The secret, if the job has one.
    pub fn token(&self) -> Option<&AuthToken> {
        match self {
            Auth::Token(token) => Some(token),
            Auth::Open | Auth::Missing => None,
        }
    }

    /// The job's token, if `token` is one; else no token given.
    pub fn of_token(token: Option<AuthToken>) -> Self {
        token.map_or(Auth::Missing, Auth::Token)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn the_flags_choose_one_source_and_a_file_resolves_to_its_token() {
        assert_eq!(AuthChoice::of_flags(None, false), AuthChoice::FromEnv);
        assert_eq!(AuthChoice::of_flags(None, true), AuthChoice::NoAuth);
        assert_eq!(AuthChoice::NoAuth.resolve().unwrap(), Auth::Open);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let token = AuthToken::generate().unwrap();
        std::fs::write(&path, token.to_hex()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let choice = AuthChoice::of_flags(Some(path), false);
        assert_eq!(choice.resolve().unwrap(), Auth::Token(token.clone()));
        assert_eq!(Auth::Token(token.clone()).token(), Some(&token));
        assert_eq!(Auth::Open.token(), None);
    }
}
