//! The job token with real trainer processes: an impostor rank is refused
//! within a second and exits non-zero while the job completes; a job on
//! loopback with no token still runs, with one warning; one that other
//! machines can reach (ranks or launchers) needs a token, which `trainer
//! token` writes, or `--no-auth`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use comm::{AUTH_TOKEN_VAR, AuthToken, launch_var};
use common::{data_arg, dataset, free_port, outside_address, stderr, trainer};

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
        .args(["--timeout", "20", "--rdzv-timeout", "20"])
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

/// [`worker`] meeting rank 0 at `host`.
fn worker_at(host: &str, rank: usize, world: usize, port: u16) -> Command {
    let mut cmd = worker(rank, world, port);
    cmd.env(launch_var::MASTER_ADDR, host);
    cmd
}

/// The ways to get a token the refusal names.
const WAYS: [&str; 5] = [
    "trainer token",
    "--auth-token-file",
    "slurm-submit",
    "TRAINER_AUTH_TOKEN",
    "--no-auth",
];

#[test]
fn a_rendezvous_other_machines_can_reach_needs_a_token_or_no_auth() {
    let Some(ip) = outside_address() else { return };
    // Refused at once, by itself: no waiting for rank 1.
    let out = worker_at(&ip, 0, 2, free_port()).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    for way in WAYS {
        assert!(err.contains(way), "{way}: {err}");
    }
    assert!(!err.contains("joined"), "{err}");

    let port = free_port();
    let rank0 = worker_at(&ip, 0, 2, port).arg("--no-auth").spawn().unwrap();
    let rank1 = worker_at(&ip, 1, 2, port)
        .arg("--no-auth")
        .output()
        .unwrap();
    let rank0 = rank0.wait_with_output().unwrap();
    assert!(rank1.status.success(), "rank 1: {}", stderr(&rank1));
    assert!(rank0.status.success(), "rank 0: {}", stderr(&rank0));
    let warning = "warning: --no-auth: the rendezvous is unauthenticated";
    let said = stderr(&rank0) + &stderr(&rank1);
    assert_eq!(said.matches(warning).count(), 1, "{said}");
}

#[test]
fn trainer_token_writes_a_private_file_that_an_open_rendezvous_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("job.token");
    let token = |args: &[&str]| {
        trainer()
            .arg("token")
            .args(args)
            .arg(&file)
            .output()
            .unwrap()
    };
    let mode = || std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    let out = token(&[]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(), 0o600);
    let first = std::fs::read_to_string(&file).unwrap();
    AuthToken::from_hex(&first, "the file").unwrap();

    // Never overwritten unasked; --force makes a new, private one.
    let out = token(&[]);
    assert!(
        !out.status.success() && stderr(&out).contains("--force"),
        "{}",
        stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), first);
    std::fs::set_permissions(&file, PermissionsExt::from_mode(0o644)).unwrap();
    let out = token(&["--force"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(mode(), 0o600);
    assert_ne!(std::fs::read_to_string(&file).unwrap(), first);

    let Some(ip) = outside_address() else { return };
    let port = free_port();
    let with_file = |rank| {
        let mut cmd = worker_at(&ip, rank, 2, port);
        cmd.arg("--auth-token-file").arg(&file);
        cmd
    };
    let rank0 = with_file(0).spawn().unwrap();
    let rank1 = with_file(1).output().unwrap();
    let rank0 = rank0.wait_with_output().unwrap();
    assert!(rank1.status.success(), "rank 1: {}", stderr(&rank1));
    assert!(rank0.status.success(), "rank 0: {}", stderr(&rank0));
    assert!(!stderr(&rank0).contains("warning"), "{}", stderr(&rank0));
}

/// The launchers' own store is held to the same rule as the workers'.
#[test]
fn launchers_other_machines_can_reach_need_a_token_or_no_auth() {
    let Some(ip) = outside_address() else { return };
    let port = free_port().to_string();
    let launcher = |node: &str, extra: &[&str]| {
        let mut cmd = trainer();
        cmd.env_remove(AUTH_TOKEN_VAR)
            .args([
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                node,
            ])
            .args(["--master-addr", &ip, "--master-port", &port])
            .args(["--epochs", "1", "--max-steps", "2", "--threads", "1"])
            .args(["--timeout", "20", "--rdzv-timeout", "20"])
            .args(data_arg(dataset()))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        cmd
    };
    let out = launcher("0", &[]).output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("launcher (--nnodes 2): the rendezvous at"),
        "{err}"
    );
    for way in WAYS {
        assert!(err.contains(way), "{way}: {err}");
    }
    assert!(!err.contains("started rank"), "{err}");

    let node0 = launcher("0", &["--no-auth"]).spawn().unwrap();
    let node1 = launcher("1", &["--no-auth"]).output().unwrap();
    let node0 = node0.wait_with_output().unwrap();
    assert!(node1.status.success(), "node 1: {}", stderr(&node1));
    assert!(node0.status.success(), "node 0: {}", stderr(&node0));
    let warning = "warning: --no-auth: the launchers' rendezvous is unauthenticated";
    assert_eq!(
        stderr(&node0).matches(warning).count(),
        1,
        "{}",
        stderr(&node0)
    );
    assert!(!stderr(&node1).contains(warning), "{}", stderr(&node1));
}
