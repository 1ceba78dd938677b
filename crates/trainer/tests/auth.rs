//! The job token with real trainer processes: an impostor rank is refused
//! within a second and exits non-zero while the job completes; a job with
//! no token still runs, with one warning.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comm::{AUTH_TOKEN_VAR, AuthToken, launch_var};
use common::{data_arg, dataset, free_port, stderr, trainer};

/// A worker started as `rank` of `world` by hand, as torchrun would.
fn worker(rank: usize, world: usize, port: u16) -> Command {
    let mut cmd = trainer();
    cmd.env_remove(AUTH_TOKEN_VAR)
        .env(launch_var::RANK, rank.to_string())
        .env(launch_var::WORLD_SIZE, world.to_string())
        .env(launch_var::LOCAL_RANK, rank.to_string())
        .env(launch_var::LOCAL_WORLD_SIZE, world.to_string())
        .env(launch_var::MASTER_ADDR, "127.0.0.1")
        .env(launch_var::MASTER_PORT, port.to_string())
        .args(["--epochs", "1", "--max-steps", "2", "--threads", "1"])
        .args(["--timeout", "20"])
        .args(data_arg(dataset()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    cmd
}

const WARNING: &str = "the rendezvous is unauthenticated";

#[test]
fn an_impostor_rank_exits_non_zero_and_the_job_completes() {
    let token = AuthToken::generate().unwrap();
    let port = free_port();
    let rank0 = worker(0, 2, port)
        .env(AUTH_TOKEN_VAR, token.to_hex())
        .spawn()
        .unwrap();

    // The impostor claims rank 1 with a wrong token. The first one may wait
    // for rank 0's store to listen; the second is timed.
    let wrong = AuthToken::generate().unwrap();
    let impostor = || {
        worker(1, 2, port)
            .env(AUTH_TOKEN_VAR, wrong.to_hex())
            .output()
            .unwrap()
    };
    let first = impostor();
    let started = Instant::now();
    let out = impostor();
    let took = started.elapsed();
    for out in [&first, &out] {
        let err = stderr(out);
        assert!(!out.status.success(), "the impostor was let in: {err}");
        assert!(err.contains("the job's auth token did not match"), "{err}");
        assert!(
            !err.contains(&wrong.to_hex()) && !err.contains(&token.to_hex()),
            "{err}"
        );
    }
    // The process, not just the handshake: start-up and data loading
    // included, which the one-second handshake budget leaves room for.
    assert!(took < Duration::from_secs(10), "refused after {took:?}");

    // The real rank 1 still joins and the job completes.
    let rank1 = worker(1, 2, port)
        .env(AUTH_TOKEN_VAR, token.to_hex())
        .output()
        .unwrap();
    let rank0 = rank0.wait_with_output().unwrap();
    assert!(rank1.status.success(), "rank 1: {}", stderr(&rank1));
    assert!(rank0.status.success(), "rank 0: {}", stderr(&rank0));
    assert!(
        stderr(&rank0).contains("refused a connection"),
        "{}",
        stderr(&rank0)
    );
    assert!(!stderr(&rank0).contains(WARNING));
}

#[test]
fn a_job_without_a_token_runs_with_one_warning() {
    let port = free_port();
    let rank0 = worker(0, 2, port).spawn().unwrap();
    let rank1 = worker(1, 2, port).output().unwrap();
    let rank0 = rank0.wait_with_output().unwrap();
    assert!(rank1.status.success(), "rank 1: {}", stderr(&rank1));
    assert!(rank0.status.success(), "rank 0: {}", stderr(&rank0));
    let warnings =
        stderr(&rank0).matches(WARNING).count() + stderr(&rank1).matches(WARNING).count();
    assert_eq!(
        warnings,
        1,
        "rank 0: {}\nrank 1: {}",
        stderr(&rank0),
        stderr(&rank1)
    );
}

#[test]
fn a_token_file_others_can_read_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, AuthToken::generate().unwrap().to_hex()).unwrap();
    std::fs::set_permissions(&file, PermissionsExt::from_mode(0o644)).unwrap();
    let out = worker(0, 2, free_port())
        .arg("--auth-token-file")
        .arg(&file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("chmod 600"), "{}", stderr(&out));
}
