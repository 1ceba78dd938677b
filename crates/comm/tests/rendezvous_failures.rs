//! Jobs that cannot form: missing ranks, inconsistent configuration, a
//! taken port. Each must fail with an error that says what is wrong, within
//! the timeout, and never hang or panic.

mod common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use comm::{CommConfig, CommError, Rejection, Store, StoreHost, StoreServer, TcpCommunicator};
use common::{HANG_TIMEOUT, config, connect_all, free_port};

#[test]
fn missing_ranks_are_named_after_the_timeout() {
    let port = free_port();
    let timeout = Duration::from_millis(600);
    let start = Instant::now();
    // A world of 4 where ranks 1 and 3 never start.
    let results = connect_all(vec![
        config(0, 4, port, timeout),
        config(2, 4, port, timeout),
    ]);
    let elapsed = start.elapsed();
    assert!(
        elapsed >= timeout,
        "gave up before the timeout: {results:?}"
    );
    assert!(elapsed < HANG_TIMEOUT, "took {elapsed:?}");
    for result in results {
        let err = result.unwrap_err();
        match &err {
            CommError::RendezvousTimeout {
                missing,
                world_size,
                ..
            } => {
                assert_eq!(*missing, [1, 3], "{err}");
                assert_eq!(*world_size, 4);
            }
            other => panic!("expected a rendezvous timeout, got: {other}"),
        }
        assert!(err.to_string().contains("[1, 3]"), "{err}");
    }
}

#[test]
fn world_size_mismatch_fails_every_rank_with_both_values() {
    let port = free_port();
    let timeout = Duration::from_secs(10);
    let start = Instant::now();
    let results = connect_all(vec![
        config(0, 2, port, timeout),
        config(1, 3, port, timeout),
    ]);
    assert!(start.elapsed() < timeout, "a rank waited for its timeout");
    for result in results {
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                CommError::Rejected(Rejection::WorldSizeMismatch {
                    rank: 1,
                    rank_world_size: 3,
                    master_world_size: 2
                })
            ),
            "{err}"
        );
    }
}

#[test]
fn duplicate_rank_fails_the_job() {
    let port = free_port();
    let timeout = Duration::from_secs(10);
    let results = connect_all(vec![
        config(0, 3, port, timeout),
        config(1, 3, port, timeout),
        config(1, 3, port, timeout),
    ]);
    for result in results {
        let err = result.unwrap_err();
        assert!(
            matches!(
                err,
                CommError::Rejected(Rejection::DuplicateRank { rank: 1 })
            ),
            "{err}"
        );
    }
}

#[test]
fn master_port_in_use_is_reported_on_rank_0() {
    let taken = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let err = TcpCommunicator::connect(&config(0, 2, port, Duration::from_secs(1))).unwrap_err();
    assert!(
        matches!(err, CommError::PortInUse { port: p, .. } if p == port),
        "{err}"
    );
    assert!(
        err.to_string().contains(&format!(
            "MASTER_PORT {port} on 127.0.0.1 is already in use"
        )),
        "{err}"
    );
}

/// A launcher's store (`StoreHost::Launcher`): rank 0 joins it as every
/// rank does, and does not try to bind its port (which a rank 0 of its
/// own would find in use). The store outlives the ranks' communicators.
#[test]
fn ranks_meet_at_a_launchers_store_and_it_outlives_them() {
    let server = StoreServer::bind_with_auth("127.0.0.1", 0, 2, HANG_TIMEOUT, None).unwrap();
    let port = server.port();
    let configs = (0..2)
        .map(|r| config(r, 2, port, HANG_TIMEOUT).with_store(StoreHost::Launcher))
        .collect();
    let comms: Vec<TcpCommunicator> = connect_all(configs)
        .into_iter()
        .map(|c| c.expect("joining the launcher's store"))
        .collect();
    drop(comms);
    // Rank 0 gone, the store still answers.
    let mut store =
        Store::connect(&config(1, 2, port, HANG_TIMEOUT).with_store(StoreHost::Launcher));
    assert!(
        matches!(
            &store,
            Err(CommError::Rejected(Rejection::DuplicateRank { rank: 1 }))
        ),
        "{store:?}"
    );
    store = Store::connect(&config(0, 2, port, HANG_TIMEOUT).with_store(StoreHost::Launcher));
    assert!(store.is_err(), "rank 0 registered twice");
}

#[test]
fn invalid_rank_and_world_size_are_refused_before_any_networking() {
    let port = free_port();
    let err = TcpCommunicator::connect(&config(2, 2, port, HANG_TIMEOUT)).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::Rejected(Rejection::RankOutOfRange {
                rank: 2,
                world_size: 2
            })
        ),
        "{err}"
    );
    let err = TcpCommunicator::connect(&config(0, 0, port, HANG_TIMEOUT)).unwrap_err();
    assert!(err.to_string().contains("WORLD_SIZE=0"), "{err}");
}

#[test]
fn world_size_one_needs_no_peers() {
    use comm::{Communicator, ReduceOp};
    // No store is started, so even an unusable address works.
    let mut comm = TcpCommunicator::connect(&CommConfig::new(0, 1, "", 0)).unwrap();
    let mut buf = [1.0, 2.0];
    comm.all_reduce(&mut buf, ReduceOp::Avg).unwrap();
    comm.broadcast(&mut buf, 0).unwrap();
    comm.barrier().unwrap();
    assert_eq!(buf, [1.0, 2.0]);
}
