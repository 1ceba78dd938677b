//! The job token over real sockets: impostors are refused at the handshake
//! within a second, the job's own ranks go on, and a recorded handshake
//! cannot be replayed.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use comm::{
    AuthFailure, AuthToken, CommConfig, CommError, Communicator, ReduceOp, Store, StoreServer,
    TcpCommunicator,
};
use common::{HANG_TIMEOUT, config, free_port};

fn authed(rank: usize, world: usize, port: u16, token: &AuthToken) -> CommConfig {
    config(rank, world, port, HANG_TIMEOUT).with_auth(comm::Auth::Token(token.clone()))
}

/// Connects as an impostor and returns its error and how long the refusal took.
fn impostor(config: &CommConfig) -> (CommError, Duration) {
    let started = Instant::now();
    let err = Store::connect(config).expect_err("an impostor must be refused");
    (err, started.elapsed())
}

#[test]
fn a_wrong_or_missing_token_is_refused_within_a_second_and_the_job_completes() {
    let token = AuthToken::generate().unwrap();
    let port = free_port();
    let results: Vec<f32> = std::thread::scope(|scope| {
        let rank0 = scope.spawn(|| {
            let mut comm = TcpCommunicator::connect(&authed(0, 2, port, &token)).unwrap();
            let mut x = [1.0_f32];
            comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
            x[0]
        });
        // Rank 0 may not listen yet: the impostor retries its connect like
        // any rank, then is refused by the handshake.
        let wrong = AuthToken::generate().unwrap();
        let (err, _) = impostor(&authed(1, 2, port, &wrong));
        assert!(
            matches!(
                &err,
                CommError::Auth {
                    failure: AuthFailure::TokenMismatch,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("the job's auth token did not match"),
            "{err}"
        );
        assert!(
            !err.to_string().contains(&wrong.to_hex()),
            "the error shows the secret: {err}"
        );

        let started = Instant::now();
        let err = Store::connect(&config(1, 2, port, HANG_TIMEOUT)).unwrap_err();
        assert!(
            matches!(
                &err,
                CommError::Auth {
                    failure: AuthFailure::TokenMissing,
                    ..
                }
            ),
            "{err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );

        // The real rank 1 still joins: the impostors registered nothing.
        let mut comm = TcpCommunicator::connect(&authed(1, 2, port, &token)).unwrap();
        let mut x = [2.0_f32];
        comm.all_reduce(&mut x, ReduceOp::Sum).unwrap();
        vec![rank0.join().unwrap(), x[0]]
    });
    assert_eq!(results, [3.0, 3.0]);
}

#[test]
fn a_refusal_takes_less_than_a_second_once_the_store_listens() {
    let token = AuthToken::generate().unwrap();
    let server =
        StoreServer::bind_with_auth("127.0.0.1", 0, 2, HANG_TIMEOUT, Some(token.clone())).unwrap();
    let (err, took) = impostor(&authed(
        1,
        2,
        server.port(),
        &AuthToken::generate().unwrap(),
    ));
    assert!(matches!(err, CommError::Auth { .. }), "{err}");
    assert!(took < Duration::from_secs(1), "refused after {took:?}");
    // A client that connects and never speaks is dropped after the
    // handshake timeout, without holding up a real rank.
    let silent = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    Store::connect(&authed(1, 2, server.port(), &token)).unwrap();
    drop(silent);
}

#[test]
fn a_job_without_token_refuses_a_rank_with_one_and_says_why() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, HANG_TIMEOUT).unwrap();
    let err = Store::connect(&authed(
        1,
        2,
        server.port(),
        &AuthToken::generate().unwrap(),
    ))
    .unwrap_err();
    assert!(
        matches!(
            &err,
            CommError::Auth {
                failure: AuthFailure::PeerUnauthenticated,
                ..
            }
        ),
        "{err}"
    );
    Store::connect(&config(1, 2, server.port(), HANG_TIMEOUT)).unwrap();
}

/// Relays one connection from a client to `target`, keeping a copy of
/// every byte the client sent.
fn recording_proxy(target: u16) -> (u16, Arc<Mutex<Vec<u8>>>, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let recorded = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&recorded);
    let relay = std::thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = TcpStream::connect(("127.0.0.1", target)).unwrap();
        let (mut client_in, mut server_out) =
            (client.try_clone().unwrap(), server.try_clone().unwrap());
        let back = std::thread::spawn(move || {
            let _ = std::io::copy(&mut &server, &mut &client);
            let _ = client.shutdown(Shutdown::Write);
        });
        let mut buf = [0_u8; 4096];
        while let Ok(n @ 1..) = client_in.read(&mut buf) {
            record.lock().unwrap().extend_from_slice(&buf[..n]);
            if server_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        // The store keeps its end open until it stops: stop listening to it.
        let _ = server_out.shutdown(Shutdown::Both);
        back.join().unwrap();
    });
    (port, recorded, relay)
}

#[test]
fn a_recorded_handshake_cannot_be_replayed() {
    let token = AuthToken::generate().unwrap();
    let server =
        StoreServer::bind_with_auth("127.0.0.1", 0, 3, HANG_TIMEOUT, Some(token.clone())).unwrap();
    let (proxy_port, recorded, relay) = recording_proxy(server.port());
    let mut genuine = Store::connect(&authed(1, 3, proxy_port, &token)).unwrap();
    genuine.set("k", b"v").unwrap();
    drop(genuine);
    relay.join().unwrap();
    let recorded = recorded.lock().unwrap().clone();
    assert!(
        recorded.len() > 4 + 2 + 32 + 32,
        "the recording holds requests too"
    );

    // Send the whole recorded conversation on a fresh connection: the
    // store's new nonce makes the old proof wrong, so it hangs up before
    // answering any request.
    let mut replay = TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    replay.set_read_timeout(Some(HANG_TIMEOUT)).unwrap();
    let _ = replay.write_all(&recorded);
    let mut answer = Vec::new();
    let _ = replay.read_to_end(&mut answer);
    // The store's hello and proof at most (a reset may cut them short).
    let handshake_only = 4 + 2 + 32 + 32;
    assert!(
        answer.len() <= handshake_only,
        "the store answered a replayed request"
    );

    // The store is not poisoned and the other ranks still join.
    let mut rank2 = Store::connect(&authed(2, 3, server.port(), &token)).unwrap();
    assert_eq!(rank2.get("k").unwrap(), b"v");
}
