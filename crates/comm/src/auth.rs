//! The job secret, and the handshake by which both ends of every store and
//! ring connection prove they hold it.
//!
//! Each side sends a hello (magic, version, whether it holds a token, a
//! fresh 256-bit nonce), then an HMAC-SHA256 over both nonces and its own
//! role, and checks the peer's HMAC in constant time. The secret never
//! travels; a recorded handshake is useless on a new connection, where the
//! other side's nonce is new. The role label keeps one side's proof from
//! being reflected back as the other's.

use std::fmt;
use std::io::{self, Read, Write};
#[cfg(unix)]
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable that carries the job token (64 hex digits).
pub const AUTH_TOKEN_VAR: &str = "TRAINER_AUTH_TOKEN";

/// How long an accepting side waits for each handshake message: a peer
/// that connects and says nothing costs at most this much.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(1);

const TOKEN_BYTES: usize = 32;
const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const MAGIC: [u8; 4] = *b"CMAU";
const VERSION: u8 = 1;
const HELLO_BYTES: usize = MAGIC.len() + 2 + NONCE_BYTES;
const PROOF_LABEL: &[u8] = b"fmnist-ddp comm auth v1";

type HmacSha256 = Hmac<Sha256>;

/// A 256-bit job secret. Its `Debug` never shows the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken([u8; TOKEN_BYTES]);

impl fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AuthToken(<redacted>)")
    }
}

/// Why a token could not be had. No message contains the token itself.
#[derive(Debug, thiserror::Error)]
pub enum AuthTokenError {
    /// The text is not 64 hex digits: `chars` characters (after trimming
    /// white space), `hex` whether they all are hex digits.
    #[error(
        "{origin} does not hold a job token: expected 64 hex digits (256 bits), found {}",
        found_instead(*chars, *hex)
    )]
    Malformed {
        origin: String,
        chars: usize,
        hex: bool,
    },
    #[error("auth token file {path} is a directory, not a token file")]
    Directory { path: String },
    #[error(
        "auth token file {path} can be read or written by other users (mode {mode:o}); make it private with `chmod 600 {path}`"
    )]
    NotPrivate { path: String, mode: u32 },
    /// The message leaves out the cause: it is the error's
    /// [`source`](std::error::Error::source), which `anyhow`'s `{:#}` (how
    /// the trainer prints errors) appends after a colon.
    #[error("cannot read the auth token file {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the operating system's random number generator failed: {0}")]
    Random(String),
}

/// What a malformed token consists of, without repeating it.
fn found_instead(chars: usize, hex: bool) -> String {
    let plural = if chars == 1 { "" } else { "s" };
    match (chars, hex) {
        (0, _) => "nothing".to_string(),
        (_, true) => format!("{chars} hex digit{plural}"),
        (_, false) => format!("{chars} character{plural}, not all of them hex digits"),
    }
}

impl AuthToken {
    /// A fresh secret from the operating system's random number generator.
    pub fn generate() -> Result<Self, AuthTokenError> {
        let mut bytes = [0_u8; TOKEN_BYTES];
        getrandom::fill(&mut bytes).map_err(|e| AuthTokenError::Random(e.to_string()))?;
        Ok(AuthToken(bytes))
    }

    /// Parses 64 hex digits; `origin` names where they came from, for errors.
    pub fn from_hex(text: &str, origin: &str) -> Result<Self, AuthTokenError> {
        let text = text.trim();
        let malformed = || AuthTokenError::Malformed {
            origin: origin.to_string(),
            chars: text.chars().count(),
            hex: text.chars().all(|c| c.is_ascii_hexdigit()),
        };
        if text.len() != 2 * TOKEN_BYTES || !text.is_ascii() {
            return Err(malformed());
        }
        let mut bytes = [0_u8; TOKEN_BYTES];
        for (byte, pair) in bytes.iter_mut().zip(text.as_bytes().chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| malformed())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| malformed())?;
        }
        Ok(AuthToken(bytes))
    }

    /// The token as 64 lower-case hex digits, for the environment of a
    /// child process or a job script.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads a token file, refusing one that other users could read or
    /// change (any of the mode bits 0o077).
    pub fn from_file(path: &Path) -> Result<Self, AuthTokenError> {
        let shown = path.display().to_string();
        let read_error = |source| AuthTokenError::Read {
            path: shown.clone(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read_error)?;
        let metadata = file.metadata().map_err(read_error)?;
        if metadata.is_dir() {
            return Err(AuthTokenError::Directory { path: shown });
        }
        #[cfg(unix)]
        {
            let mode = metadata.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(AuthTokenError::NotPrivate { path: shown, mode });
            }
        }
        let mut text = String::new();
        (&file)
            .take(1024)
            .read_to_string(&mut text)
            .map_err(read_error)?;
        AuthToken::from_hex(&text, &shown)
    }
}

/// Why a handshake failed. The connection is closed either way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthFailure {
    #[error(
        "the job's auth token did not match: the two sides hold different tokens (set {AUTH_TOKEN_VAR} or --auth-token-file to this job's token)"
    )]
    TokenMismatch,
    #[error(
        "the job requires an auth token and this process has none (set {AUTH_TOKEN_VAR} or --auth-token-file to this job's token)"
    )]
    TokenMissing,
    #[error(
        "this process has an auth token but the other side runs unauthenticated; every rank of a job needs the same token, or none"
    )]
    PeerUnauthenticated,
    #[error(
        "the other side does not speak this job's handshake (a stray connection or another program)"
    )]
    NotAPeer,
    #[error(
        "the other side took the connection but said nothing in time (its process stopped, e.g. by SIGSTOP or a debugger, or its machine suspended, cut off or overloaded)"
    )]
    Silent,
    #[error(
        "the handshake broke off: {0} (the other side closed the connection, or is not part of this job)"
    )]
    Broken(String),
}

impl From<io::Error> for AuthFailure {
    fn from(e: io::Error) -> Self {
        // A read timeout surfaces as EAGAIN ("Resource temporarily
        // unavailable"), which says nothing to a user.
        if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            return AuthFailure::Silent;
        }
        AuthFailure::Broken(e.to_string())
    }
}

/// Which end of the connection this side is; part of each proof, so the
/// two proofs of one handshake differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    Initiator,
    Acceptor,
}

impl Role {
    fn label(self) -> u8 {
        match self {
            Role::Initiator => b'I',
            Role::Acceptor => b'A',
        }
    }

    fn other(self) -> Role {
        match self {
            Role::Initiator => Role::Acceptor,
            Role::Acceptor => Role::Initiator,
        }
    }
}

/// Runs the handshake on a blocking `stream` whose read and write timeouts
/// the caller has set. With `token` both sides must hold the same token;
/// without, both sides must hold none.
pub(crate) fn handshake(
    mut stream: impl Read + Write,
    token: Option<&AuthToken>,
    role: Role,
) -> Result<(), AuthFailure> {
    let mut nonce = [0_u8; NONCE_BYTES];
    if token.is_some() {
        getrandom::fill(&mut nonce).map_err(|e| AuthFailure::Broken(e.to_string()))?;
    }
    let mut hello = [0_u8; HELLO_BYTES];
    hello[..MAGIC.len()].copy_from_slice(&MAGIC);
    hello[4] = VERSION;
    hello[5] = u8::from(token.is_some());
    hello[6..].copy_from_slice(&nonce);
    stream.write_all(&hello)?;

    let mut theirs = [0_u8; HELLO_BYTES];
    stream.read_exact(&mut theirs)?;
    if theirs[..MAGIC.len()] != MAGIC || theirs[4] != VERSION || theirs[5] > 1 {
        return Err(AuthFailure::NotAPeer);
    }
    let token = match (token, theirs[5] == 1) {
        (None, false) => return Ok(()),
        (None, true) => return Err(AuthFailure::TokenMissing),
        (Some(_), false) => return Err(AuthFailure::PeerUnauthenticated),
        (Some(token), true) => token,
    };
    let their_nonce = &theirs[6..];
    let (initiator_nonce, acceptor_nonce) = match role {
        Role::Initiator => (&nonce[..], their_nonce),
        Role::Acceptor => (their_nonce, &nonce[..]),
    };
    let ours = proof(token, role, initiator_nonce, acceptor_nonce).finalize();
    stream.write_all(&ours.into_bytes())?;
    let mut their_proof = [0_u8; PROOF_BYTES];
    stream.read_exact(&mut their_proof)?;
    proof(token, role.other(), initiator_nonce, acceptor_nonce)
        .verify_slice(&their_proof)
        .map_err(|_| AuthFailure::TokenMismatch)
}

/// The MAC that `role` sends: over both nonces, so it holds for this
/// connection only.
fn proof(
    token: &AuthToken,
    role: Role,
    initiator_nonce: &[u8],
    acceptor_nonce: &[u8],
) -> HmacSha256 {
    // HMAC accepts keys of every length; this cannot fail.
    let mut mac = HmacSha256::new_from_slice(&token.0).expect("HMAC takes keys of any length");
    mac.update(PROOF_LABEL);
    mac.update(&[role.label()]);
    mac.update(initiator_nonce);
    mac.update(acceptor_nonce);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    fn run_pair(
        left: Option<AuthToken>,
        right: Option<AuthToken>,
    ) -> (Result<(), AuthFailure>, Result<(), AuthFailure>) {
        let (a, b) = UnixStream::pair().unwrap();
        for s in [&a, &b] {
            s.set_read_timeout(Some(HANDSHAKE_TIMEOUT)).unwrap();
        }
        let acceptor = std::thread::spawn(move || handshake(&b, right.as_ref(), Role::Acceptor));
        let initiator = handshake(&a, left.as_ref(), Role::Initiator);
        drop(a);
        (initiator, acceptor.join().unwrap())
    }

    #[test]
    fn same_token_passes_both_ways() {
        let token = AuthToken::generate().unwrap();
        let (i, a) = run_pair(Some(token.clone()), Some(token));
        assert_eq!((i, a), (Ok(()), Ok(())));
    }

    #[test]
    fn different_tokens_fail_on_both_sides() {
        let (i, a) = run_pair(
            Some(AuthToken::generate().unwrap()),
            Some(AuthToken::generate().unwrap()),
        );
        assert_eq!(i, Err(AuthFailure::TokenMismatch));
        assert_eq!(a, Err(AuthFailure::TokenMismatch));
    }

    #[test]
    fn a_token_on_one_side_only_fails_with_a_clear_reason_on_both() {
        let (i, a) = run_pair(None, Some(AuthToken::generate().unwrap()));
        assert_eq!(i, Err(AuthFailure::TokenMissing));
        assert_eq!(a, Err(AuthFailure::PeerUnauthenticated));
        let (i, a) = run_pair(Some(AuthToken::generate().unwrap()), None);
        assert_eq!(i, Err(AuthFailure::PeerUnauthenticated));
        assert_eq!(a, Err(AuthFailure::TokenMissing));
    }

    /// A side that takes the connection and says nothing (a stopped
    /// process) is named as silent, not as a broken or foreign handshake.
    #[test]
    fn a_side_that_says_nothing_is_silent() {
        let (a, quiet) = UnixStream::pair().unwrap();
        a.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let failure = handshake(&a, None, Role::Initiator).unwrap_err();
        assert_eq!(failure, AuthFailure::Silent);
        assert!(failure.to_string().contains("SIGSTOP"), "{failure}");
        drop(quiet);
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        assert!(matches!(
            handshake(&a, None, Role::Initiator),
            Err(AuthFailure::Broken(_))
        ));
    }

    #[test]
    fn no_token_on_either_side_passes() {
        assert_eq!(run_pair(None, None), (Ok(()), Ok(())));
    }

    #[test]
    fn hex_round_trips_and_bad_text_is_refused_without_echoing_it() {
        let token = AuthToken::generate().unwrap();
        assert_eq!(AuthToken::from_hex(&token.to_hex(), "t").unwrap(), token);
        let secretish = "zz".repeat(32);
        let err = AuthToken::from_hex(&secretish, "TRAINER_AUTH_TOKEN").unwrap_err();
        assert!(!err.to_string().contains(&secretish), "{err}");
        assert!(AuthToken::from_hex("abcd", "t").is_err());
        assert_eq!(format!("{token:?}"), "AuthToken(<redacted>)");
    }

    #[test]
    fn a_token_file_readable_by_others_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let token = AuthToken::generate().unwrap();
        std::fs::write(&path, token.to_hex()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = AuthToken::from_file(&path).unwrap_err();
        assert!(
            matches!(err, AuthTokenError::NotPrivate { mode: 0o644, .. }),
            "{err}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(AuthToken::from_file(&path).unwrap(), token);
    }

    #[test]
    fn a_malformed_token_is_described_in_a_whole_sentence() {
        let found = |text: &str| {
            let err = AuthToken::from_hex(text, AUTH_TOKEN_VAR).unwrap_err();
            let message = err.to_string();
            let prefix = format!(
                "{AUTH_TOKEN_VAR} does not hold a job token: expected 64 hex digits (256 bits), found "
            );
            message
                .strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("{message}"))
                .to_string()
        };
        assert_eq!(found("abc"), "3 hex digits");
        assert_eq!(found(" a\n"), "1 hex digit");
        assert_eq!(found("xyz"), "3 characters, not all of them hex digits");
        assert_eq!(
            found(&"zz".repeat(32)),
            "64 characters, not all of them hex digits"
        );
        assert_eq!(found(""), "nothing");
    }

    #[test]
    fn a_directory_is_not_a_token_file() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [0o755, 0o700] {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap();
            let err = AuthToken::from_file(dir.path()).unwrap_err();
            assert!(matches!(err, AuthTokenError::Directory { .. }), "{err:?}");
            assert_eq!(
                err.to_string(),
                format!(
                    "auth token file {} is a directory, not a token file",
                    dir.path().display()
                )
            );
        }
    }

    #[test]
    fn an_unreadable_token_file_states_the_os_error_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        let err = AuthToken::from_file(&path).unwrap_err();
        // The OS error is the source, for `{:#}` to print after the message.
        let cause = std::error::Error::source(&err).and_then(|c| c.downcast_ref::<io::Error>());
        assert_eq!(cause.map(io::Error::kind), Some(io::ErrorKind::NotFound));
        assert_eq!(
            err.to_string(),
            format!("cannot read the auth token file {}", path.display())
        );
    }
}
