//! Joining and collectives each have a timeout of their own (torchrun's
//! join timeout, `rdzv_timeout`, and the collective timeout): a rank that
//! arrives several collective timeouts late still joins, a collective that
//! hangs fails at the collective timeout, and each error names its flag.

mod common;

use std::sync::mpsc;
use std::time::Duration;

use comm::{CommConfig, CommError, Communicator, ReduceOp, TcpCommunicator};
use common::{HANG_TIMEOUT, connect_all, free_port};

/// The collective timeout of these jobs: short beside the late arrival.
const COLLECTIVE: Duration = Duration::from_secs(1);

fn config(rank: usize, port: u16, rdzv_timeout: Duration) -> CommConfig {
    CommConfig::new(rank, 2, "127.0.0.1", port)
        .with_timeout(COLLECTIVE)
        .with_rdzv_timeout(rdzv_timeout)
}

#[test]
fn a_slow_joiner_is_accepted_while_a_hung_collective_fails_at_the_collective_timeout() {
    let port = free_port();
    let (gave_up, rank0_done) = mpsc::channel::<()>();
    let (rank0, rank1) = std::thread::scope(|scope| {
        let rank0 = scope.spawn(move || {
            let mut comm = TcpCommunicator::connect(&config(0, port, HANG_TIMEOUT))?;
            // Rank 1 never calls this all-reduce: it hangs.
            let hung = comm.all_reduce(&mut [1.0_f32], ReduceOp::Sum);
            let _ = gave_up.send(());
            hung
        });
        let rank1 = scope.spawn(move || {
            // Late by three collective timeouts: a slow boot, say.
            std::thread::sleep(COLLECTIVE * 3);
            let comm = TcpCommunicator::connect(&config(1, port, HANG_TIMEOUT))?;
            // Alive, and in no collective, until rank 0 gave up on it.
            let _ = rank0_done.recv();
            drop(comm);
            Ok::<(), CommError>(())
        });
        (rank0.join().unwrap(), rank1.join().unwrap())
    });
    rank1.expect("the late rank joins the job");
    let err = rank0.expect_err("the hung all-reduce fails");
    assert!(
        matches!(err, CommError::PeerTimeout { peer: 1, timeout, .. } if timeout == COLLECTIVE),
        "{err}"
    );
    let said = err.to_string();
    assert!(
        said.contains("(the collective timeout, --timeout)"),
        "{said}"
    );
}

#[test]
fn a_rank_later_than_the_join_timeout_is_named_with_the_join_timeout() {
    let port = free_port();
    let join = Duration::from_millis(500);
    // Rank 1 never comes; the collective timeout is far longer.
    let rank0 = connect_all(vec![config(0, port, join).with_timeout(HANG_TIMEOUT)]);
    let err = rank0.into_iter().next().unwrap().unwrap_err();
    assert!(
        matches!(&err, CommError::RendezvousTimeout { missing, timeout, .. } if *missing == [1] && *timeout == join),
        "{err}"
    );
    let said = err.to_string();
    assert!(
        said.contains("after 500ms (the join timeout, --rdzv-timeout)"),
        "{said}"
    );
    assert!(!said.contains("collective timeout"), "{said}");
}
