//! The rendezvous store on its own: values, waiting, and the checks it
//! applies to registering ranks.

mod common;

use std::time::{Duration, Instant};

use comm::{CommError, Rejection, Store, StoreServer};
use common::{config, free_port};

const TIMEOUT: Duration = Duration::from_secs(5);

fn server(world_size: usize) -> StoreServer {
    StoreServer::bind("127.0.0.1", 0, world_size, TIMEOUT).unwrap()
}

#[test]
fn values_set_by_one_rank_are_seen_by_another() {
    let server = server(2);
    let mut a = Store::connect(&config(0, 2, server.port(), TIMEOUT)).unwrap();
    let mut b = Store::connect(&config(1, 2, server.port(), TIMEOUT)).unwrap();
    let id: Vec<u8> = (0..128).collect();
    a.set("nccl/unique_id", &id).unwrap();
    assert_eq!(b.get("nccl/unique_id").unwrap(), id);
    a.set("nccl/unique_id", b"replaced").unwrap();
    assert_eq!(b.get("nccl/unique_id").unwrap(), b"replaced");
    assert_eq!(b.wait_for("never/set", Duration::ZERO).unwrap(), None);
}

#[test]
fn get_waits_for_a_value_set_later() {
    let server = server(2);
    let port = server.port();
    let mut reader = Store::connect(&config(1, 2, port, TIMEOUT)).unwrap();
    let writer = std::thread::spawn(move || {
        let mut writer = Store::connect(&config(0, 2, port, TIMEOUT)).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        writer.set("late", b"value").unwrap();
        // Keep the connection (and registration) until the reader is done.
        writer
    });
    assert_eq!(reader.get("late").unwrap(), b"value");
    drop(writer.join().unwrap());
}

#[test]
fn get_of_a_missing_key_times_out_naming_the_key() {
    let server = server(1);
    let short = Duration::from_millis(200);
    let mut store = Store::connect(&config(0, 1, server.port(), short)).unwrap();
    let start = Instant::now();
    let err = store.get("absent").unwrap_err();
    assert!(start.elapsed() >= short, "returned before the timeout");
    assert!(start.elapsed() < common::HANG_TIMEOUT);
    assert!(
        matches!(&err, CommError::StoreTimeout { key, .. } if key == "absent"),
        "{err}"
    );
    assert_eq!(
        store.wait_for("absent", Duration::from_millis(50)).unwrap(),
        None
    );
}

#[test]
fn world_size_mismatch_is_refused_and_poisons_the_store() {
    let server = server(2);
    let mut rank0 = Store::connect(&config(0, 2, server.port(), TIMEOUT)).unwrap();
    let err = Store::connect(&config(1, 3, server.port(), TIMEOUT)).unwrap_err();
    let expected = Rejection::WorldSizeMismatch {
        rank: 1,
        rank_world_size: 3,
        master_world_size: 2,
    };
    assert!(
        matches!(&err, CommError::Rejected(r) if *r == expected),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains("WORLD_SIZE=3") && text.contains("WORLD_SIZE=2"),
        "{text}"
    );
    // Rank 0, waiting for the others, learns the same reason at once.
    let start = Instant::now();
    let err = rank0.get("comm/tcp/addr/1").unwrap_err();
    assert!(start.elapsed() < TIMEOUT, "rank 0 waited for its timeout");
    assert!(
        matches!(&err, CommError::Rejected(r) if *r == expected),
        "{err}"
    );
}

#[test]
fn duplicate_rank_is_refused() {
    let server = server(3);
    let _first = Store::connect(&config(2, 3, server.port(), TIMEOUT)).unwrap();
    let err = Store::connect(&config(2, 3, server.port(), TIMEOUT)).unwrap_err();
    assert!(
        matches!(
            err,
            CommError::Rejected(Rejection::DuplicateRank { rank: 2 })
        ),
        "{err}"
    );
}

#[test]
fn second_store_on_a_taken_port_says_port_in_use() {
    let first = server(2);
    let err = StoreServer::bind("127.0.0.1", first.port(), 2, TIMEOUT).unwrap_err();
    assert!(
        matches!(&err, CommError::PortInUse { port, .. } if *port == first.port()),
        "{err}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&format!(
            "MASTER_PORT {} on 127.0.0.1 is already in use",
            first.port()
        )),
        "{text}"
    );
    assert!(text.contains("MASTER_PORT=..."), "{text}");
}

#[test]
fn unreachable_store_fails_after_the_timeout_naming_rank_0() {
    let port = free_port();
    let short = Duration::from_millis(300);
    let start = Instant::now();
    let err = Store::connect(&config(1, 2, port, short)).unwrap_err();
    assert!(start.elapsed() >= short);
    assert!(start.elapsed() < common::HANG_TIMEOUT);
    assert!(
        matches!(&err, CommError::RendezvousTimeout { missing, .. } if *missing == [0]),
        "{err}"
    );
}

#[test]
fn garbage_from_a_stray_client_does_not_stop_the_store() {
    use std::io::Write;
    let server = server(1);
    let mut stray = std::net::TcpStream::connect(("127.0.0.1", server.port())).unwrap();
    stray
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut store = Store::connect(&config(0, 1, server.port(), TIMEOUT)).unwrap();
    store.set("k", b"v").unwrap();
    assert_eq!(store.get("k").unwrap(), b"v");
}

#[test]
fn a_connected_communicator_shares_its_store_for_other_transports() {
    use comm::Communicator;
    // What a NCCL transport will do: rank 0 publishes its 128-byte unique
    // id through the job's store, the others read it.
    let id: Vec<u8> = (0..128).map(|i| (i * 7 % 256) as u8).collect();
    let seen = common::run_job(3, |mut comm| {
        let rank = comm.rank();
        let store = comm.store().expect("a multi-rank job has a store");
        if rank == 0 {
            store.set("nccl/unique_id", &id).unwrap();
        }
        let got = store.get("nccl/unique_id").unwrap();
        // Rank 0 must keep the store up until everyone has read.
        comm.barrier().unwrap();
        got
    });
    assert_eq!(seen, vec![id; 3]);
}

#[test]
fn members_joining_by_arrival_take_the_ranks_after_the_hosts_in_turn() {
    let server = server(3);
    let port = server.port();
    let (_first, first) = Store::join(&config(0, 3, port, TIMEOUT)).unwrap();
    let mut host = Store::connect(&config(0, 3, port, TIMEOUT)).unwrap();
    let (_second, second) = Store::join(&config(0, 3, port, TIMEOUT)).unwrap();
    assert_eq!((first, second), (1, 2));
    // A fourth member of a complete group of three is a stranger (another
    // job on this port): it alone is refused, and the group goes on.
    let err = Store::join(&config(0, 3, port, TIMEOUT)).unwrap_err();
    assert!(
        matches!(
            &err,
            CommError::Rejected(Rejection::RankOutOfRange {
                rank: 3,
                world_size: 3
            })
        ),
        "{err}"
    );
    host.set("anything", b"still served").unwrap();
    assert_eq!(host.get("anything").unwrap(), b"still served");
    let err = Store::connect(&config(1, 3, port, TIMEOUT)).unwrap_err();
    assert!(
        matches!(
            &err,
            CommError::Rejected(Rejection::DuplicateRank { rank: 1 })
        ),
        "{err}"
    );
    assert!(host.departed(1).is_ok_and(|gone| !gone));
}

#[test]
fn a_member_whose_connection_closes_is_marked_departed_and_the_others_see_it() {
    let server = server(3);
    let port = server.port();
    let mut host = Store::connect(&config(0, 3, port, TIMEOUT)).unwrap();
    let (joined, by_arrival) = Store::join(&config(0, 3, port, TIMEOUT)).unwrap();
    let named = Store::connect(&config(2, 3, port, TIMEOUT)).unwrap();
    assert_eq!(by_arrival, 1);
    assert!(!host.departed(1).unwrap() && !host.departed(2).unwrap());
    // Dropping a client closes its socket, as the kernel does for a killed
    // process; the store notices on its own, with no word from the client.
    drop(named);
    let deadline = Instant::now() + TIMEOUT;
    while !host.departed(2).unwrap() {
        assert!(Instant::now() < deadline, "rank 2's departure never showed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!host.departed(1).unwrap(), "rank 1 is still connected");
    drop(joined);
    while !host.departed(1).unwrap() {
        assert!(Instant::now() < deadline, "rank 1's departure never showed");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn one_look_reads_several_keys_a_departure_included() {
    let server = server(2);
    let port = server.port();
    let mut host = Store::connect(&config(0, 2, port, TIMEOUT)).unwrap();
    let mut member = Store::connect(&config(1, 2, port, TIMEOUT)).unwrap();
    member.set("heartbeat/1", &7_u64.to_le_bytes()).unwrap();
    member.set("ended/1", b"").unwrap();
    let keys = |names: &[&str]| names.iter().map(|k| k.to_string()).collect::<Vec<_>>();
    let watch = [
        Store::departed_key(1),
        "ended/1".into(),
        "heartbeat/1".into(),
    ];
    assert_eq!(
        host.look_all(&watch).unwrap(),
        [None, Some(Vec::new()), Some(7_u64.to_le_bytes().to_vec())]
    );
    drop(member);
    let deadline = Instant::now() + TIMEOUT;
    while host.look_all(&watch).unwrap()[0].is_none() {
        assert!(Instant::now() < deadline, "rank 1's departure never showed");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(host.departed(1).unwrap());
    assert_eq!(host.look_all(&[]).unwrap(), Vec::<Option<Vec<u8>>>::new());
    // Past the limit: refused before it is sent, the connection still good.
    let many = vec!["k".to_string(); Store::MAX_LOOK_KEYS + 1];
    let err = host.look_all(&many).unwrap_err();
    assert!(
        err.to_string()
            .contains("a look at 65 keys exceeds the store's limit of 64"),
        "{err}"
    );
    assert_eq!(
        host.look_all(&keys(&["ended/1"])).unwrap(),
        [Some(Vec::new())]
    );
    // What a ring of more members than the limit gathers: looks in chunks,
    // every answer in its key's place.
    let mut many = vec!["k".to_string(); 2 * Store::MAX_LOOK_KEYS + 3];
    many[Store::MAX_LOOK_KEYS + 1] = "ended/1".into();
    let values = host.look_each(&many).unwrap();
    assert_eq!(values.len(), many.len());
    let set: Vec<usize> = (0..values.len()).filter(|&i| values[i].is_some()).collect();
    assert_eq!(set, [Store::MAX_LOOK_KEYS + 1]);
}

#[test]
fn a_look_whose_answer_would_exceed_a_frame_is_refused_without_building_it() {
    let server = server(1);
    let mut host = Store::connect(&config(0, 1, server.port(), TIMEOUT)).unwrap();
    host.set("big", &vec![1_u8; 6 << 20]).unwrap();
    let twice = ["big".to_string(), "big".to_string()];
    assert_eq!(host.look_all(&twice).unwrap().len(), 2);
    // Three copies of 6 MiB are past the 16 MiB frame: the store hangs up.
    let err = host.look_all(&[twice.to_vec(), vec!["big".into()]].concat());
    assert!(matches!(err, Err(CommError::Store { .. })), "{err:?}");
}
