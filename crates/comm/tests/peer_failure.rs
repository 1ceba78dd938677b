//! A neighbour that disappears, hangs, or calls a different collective must
//! turn into an error naming it, on every surviving rank, well within the
//! timeout.

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use comm::{CommError, Communicator, ReduceOp, SameHostTransport, TcpCommunicator};
use common::{Body, TRANSPORTS, run_ranks_over};

/// Starts a job whose ranks each run their own closure.
fn run_ranks<T: Send>(timeout: Duration, bodies: Vec<Body<'_, T>>) -> Vec<T> {
    run_ranks_over(SameHostTransport::default(), timeout, bodies)
}

type Outcome = Option<(CommError, Duration)>;

#[test]
fn rank_that_drops_out_mid_job_is_named_quickly_over_both_transports() {
    for (transport, via) in TRANSPORTS.into_iter().zip(["unix socket", "tcp"]) {
        let timeout = Duration::from_secs(15);
        let (ready, go) = mpsc::channel::<()>();
        let survivor = move |mut comm: TcpCommunicator| -> Outcome {
            let mut buf = vec![1.0_f32; 1 << 20];
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            ready.send(()).unwrap();
            let start = Instant::now();
            let err = comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
            let elapsed = start.elapsed();
            // Once broken, the communicator refuses further work.
            let again = comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
            assert!(matches!(again, CommError::Broken(_)), "{again}");
            Some((err, elapsed))
        };
        let quitter = move |mut comm: TcpCommunicator| -> Outcome {
            let mut buf = vec![1.0_f32; 1 << 20];
            comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
            go.recv().unwrap();
            drop(comm);
            None
        };
        let results = run_ranks_over(
            transport,
            timeout,
            vec![Box::new(survivor), Box::new(quitter)],
        );
        let (err, elapsed) = results[0].as_ref().unwrap();
        assert!(
            *elapsed < timeout / 2,
            "took {elapsed:?}, about the timeout"
        );
        match err {
            CommError::PeerLost { peer, op, .. } => {
                assert_eq!(*peer, 1, "{err}");
                assert_eq!(*op, "all_reduce");
            }
            other => panic!("expected a lost peer, got: {other}"),
        }
        let text = err.to_string();
        assert!(
            text.starts_with("lost connection to rank 1 (127.0.0.1:"),
            "{text}"
        );
        assert!(
            text.contains(&format!(" via {via}) during all_reduce")),
            "{text}"
        );
    }
}

#[test]
fn in_a_larger_ring_every_survivor_fails_and_the_dead_rank_is_named() {
    let timeout = Duration::from_secs(15);
    let survivor = |mut comm: TcpCommunicator| -> Outcome {
        let mut buf = vec![1.0_f32; 300_000];
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        let start = Instant::now();
        let err = comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        Some((err, start.elapsed()))
    };
    let quitter = |mut comm: TcpCommunicator| -> Outcome {
        let mut buf = vec![1.0_f32; 300_000];
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        None
    };
    let results = run_ranks(
        timeout,
        vec![Box::new(survivor), Box::new(survivor), Box::new(quitter)],
    );
    for (rank, outcome) in results.iter().take(2).enumerate() {
        let (err, elapsed) = outcome.as_ref().unwrap();
        assert!(*elapsed < timeout / 2, "rank {rank} took {elapsed:?}");
        assert!(
            matches!(err, CommError::PeerLost { .. }),
            "rank {rank}: {err}"
        );
    }
    // Both survivors are linked to rank 2 (rank 1 writes to it, rank 0
    // reads from it); whichever notices first names it, and the other may
    // instead see that survivor close its links.
    assert!(
        results
            .iter()
            .flatten()
            .any(|(e, _)| matches!(e, CommError::PeerLost { peer: 2, .. })),
        "nobody named rank 2: {results:?}"
    );
}

#[test]
fn silent_peer_times_out_naming_it() {
    let timeout = Duration::from_millis(500);
    let (done, wait_done) = mpsc::channel::<()>();
    let caller = move |mut comm: TcpCommunicator| -> Outcome {
        let start = Instant::now();
        let err = comm
            .all_reduce(&mut vec![1.0_f32; 1 << 16], ReduceOp::Sum)
            .unwrap_err();
        let elapsed = start.elapsed();
        done.send(()).unwrap();
        Some((err, elapsed))
    };
    let sleeper = move |comm: TcpCommunicator| -> Outcome {
        // Alive (connection open) but never joins the collective.
        wait_done.recv().unwrap();
        drop(comm);
        None
    };
    let results = run_ranks(timeout, vec![Box::new(caller), Box::new(sleeper)]);
    let (err, elapsed) = results[0].as_ref().unwrap();
    assert!(*elapsed >= timeout, "gave up after {elapsed:?}");
    assert!(*elapsed < common::HANG_TIMEOUT);
    assert!(
        matches!(err, CommError::PeerTimeout { peer: 1, .. }),
        "{err}"
    );
}

#[test]
fn diverging_collectives_are_reported_as_a_mismatch() {
    let timeout = Duration::from_secs(10);
    let body = |len: usize| {
        move |mut comm: TcpCommunicator| -> Outcome {
            let err = comm
                .all_reduce(&mut vec![0.0_f32; len], ReduceOp::Sum)
                .unwrap_err();
            Some((err, Duration::ZERO))
        }
    };
    let results = run_ranks(timeout, vec![Box::new(body(10)), Box::new(body(12))]);
    // The first rank to read the other's header reports the mismatch and
    // closes its links; the other may see that close before the header.
    let errors: Vec<&CommError> = results.iter().map(|r| &r.as_ref().unwrap().0).collect();
    let mismatch = errors
        .iter()
        .find(|e| matches!(e, CommError::CollectiveMismatch { .. }))
        .unwrap_or_else(|| panic!("no rank reported a mismatch: {errors:?}"));
    let text = mismatch.to_string();
    assert!(
        text.contains("all_reduce(f32 x 10, sum)") && text.contains("all_reduce(f32 x 12, sum)"),
        "{text}"
    );
    for e in errors {
        assert!(
            matches!(
                e,
                CommError::CollectiveMismatch { .. } | CommError::PeerLost { .. }
            ),
            "{e}"
        );
    }
}
