//! Secure by default: a store other machines can reach does not start
//! without the job's token unless the job is `Auth::Open` (`--no-auth`),
//! and a job of one machine (a loopback master) listens on loopback alone.
//! Needs an address of this machine other than loopback (`hostname -I`);
//! skipped, saying so, where there is none.

mod common;

use std::net::{IpAddr, TcpStream};
use std::process::Command;

use comm::{
    AuthToken, CommConfig, CommError, Communicator, ReduceOp, StoreServer, TcpCommunicator,
};
use common::{HANG_TIMEOUT, free_port};

/// An IPv4 address of this machine that is not loopback, if it has one.
fn outside_address() -> Option<IpAddr> {
    let listed = Command::new("hostname").arg("-I").output().ok()?;
    let found = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback());
    if found.is_none() {
        eprintln!("skipped: `hostname -I` names no address of this machine but loopback");
    }
    found
}

fn job(ip: IpAddr, port: u16) -> Vec<CommConfig> {
    (0..2)
        .map(|rank| {
            CommConfig::new(rank, 2, ip.to_string(), port)
                .with_timeout(HANG_TIMEOUT)
                .with_rdzv_timeout(HANG_TIMEOUT)
        })
        .collect()
}

/// Every rank's sum of ones, or its error, each rank on a thread.
fn sums(configs: Vec<CommConfig>) -> Vec<Result<f32, CommError>> {
    std::thread::scope(|scope| {
        let ranks: Vec<_> = configs
            .into_iter()
            .map(|config| {
                scope.spawn(move || {
                    let mut x = [1.0_f32];
                    TcpCommunicator::connect(&config)?.all_reduce(&mut x, ReduceOp::Sum)?;
                    Ok(x[0])
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    })
}

#[test]
fn a_rendezvous_open_to_other_machines_needs_a_token_or_no_auth() {
    let Some(ip) = outside_address() else { return };
    let port = free_port();
    for result in sums(job(ip, port)) {
        let err = result.unwrap_err();
        assert!(matches!(err, CommError::TokenRequired { .. }), "{err}");
        let said = err.to_string();
        for named in [
            "trainer token",
            "TRAINER_AUTH_TOKEN",
            "--no-auth",
            "slurm-submit",
        ] {
            assert!(said.contains(named), "{named}: {said}");
        }
    }
    let open = job(ip, free_port())
        .into_iter()
        .map(|c| c.with_auth(comm::Auth::Open));
    assert_eq!(
        sums(open.collect())
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        [2.0; 2]
    );
    let token = AuthToken::generate().unwrap();
    let closed = job(ip, free_port())
        .into_iter()
        .map(|c| c.with_auth(comm::Auth::Token(token.clone())));
    assert_eq!(
        sums(closed.collect())
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>(),
        [2.0; 2]
    );
}

#[test]
fn a_store_for_a_loopback_master_listens_on_loopback_alone() {
    let Some(ip) = outside_address() else { return };
    let store = StoreServer::bind("127.0.0.1", 0, 2, HANG_TIMEOUT).unwrap();
    let port = store.port();
    assert!(TcpStream::connect(("127.0.0.1", port)).is_ok());
    assert!(
        TcpStream::connect((ip, port)).is_err(),
        "the store of a loopback job is reachable at {ip}:{port}"
    );
    // One for another machine's ranks listens where they can reach it.
    let open = StoreServer::bind(&ip.to_string(), 0, 2, HANG_TIMEOUT).unwrap();
    assert!(TcpStream::connect((ip, open.port())).is_ok());
}
