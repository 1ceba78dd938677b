//! The store protocol's encodings, and its bounds on hostile input.

use super::*;

#[test]
fn requests_round_trip() {
    let requests = [
        Request::Hello {
            rank: 3,
            world_size: 8,
        },
        Request::Set {
            key: "nccl/unique_id".into(),
            value: (0..128).collect(),
        },
        Request::Set {
            key: String::new(),
            value: Vec::new(),
        },
        Request::Join { world_size: 3 },
        Request::Get {
            key: "comm/addr/1".into(),
            wait: Duration::from_millis(1500),
        },
        Request::Poison(Rejection::RanksMissing {
            missing: vec![2],
            world_size: 3,
        }),
        Request::Look {
            keys: vec![
                "comm/departed/1".into(),
                String::new(),
                "heartbeat/1".into(),
            ],
        },
        Request::Look { keys: Vec::new() },
        Request::Enlist {
            step: Some(41),
            suspect: None,
            wait: Duration::from_secs(600),
        },
        Request::Enlist {
            step: None,
            suspect: Some(3),
            wait: Duration::ZERO,
        },
    ];
    for r in requests {
        assert_eq!(Request::decode(&r.encode()).unwrap(), r);
    }
}

#[test]
fn responses_round_trip() {
    let responses = [
        Response::Ok,
        Response::NotFound,
        Response::Generation {
            number: 7,
            members: vec![(2, Some(40)), (0, Some(39)), (3, None)],
        },
        Response::Generation {
            number: 1,
            members: Vec::new(),
        },
        Response::Evicted { generation: 3 },
        Response::JobOver,
        Response::Lost,
        Response::Value(b"10.0.0.2:4567".to_vec()),
        Response::Rejected(Rejection::WorldSizeMismatch {
            rank: 1,
            rank_world_size: 3,
            master_world_size: 2,
        }),
        Response::Rejected(Rejection::DuplicateRank { rank: 2 }),
        Response::Rejected(Rejection::RanksMissing {
            missing: vec![1, 3],
            world_size: 4,
        }),
        Response::Rejected(Rejection::RankOutOfRange {
            rank: 9,
            world_size: 4,
        }),
        Response::Values(vec![
            None,
            Some(Vec::new()),
            Some(7_u64.to_le_bytes().to_vec()),
        ]),
        Response::Values(Vec::new()),
    ];
    for r in responses {
        assert_eq!(Response::decode(&r.encode()).unwrap(), r);
    }
}

#[test]
fn truncated_and_trailing_bytes_are_errors() {
    let full = Request::Set {
        key: "k".into(),
        value: vec![1, 2, 3],
    }
    .encode();
    for cut in 0..full.len() {
        assert!(
            Request::decode(&full[..cut]).is_err(),
            "prefix of {cut} bytes decoded"
        );
    }
    let mut long = full.clone();
    long.push(0);
    assert!(Request::decode(&long).is_err());
}

#[test]
fn frames_round_trip_and_oversized_frames_are_refused() {
    let mut wire = Vec::new();
    write_frame(&mut wire, b"hello").unwrap();
    assert_eq!(read_frame(&wire[..]).unwrap(), b"hello");

    let mut huge = Vec::new();
    huge.extend_from_slice(&u32::MAX.to_le_bytes());
    let err = read_frame(&huge[..]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidData);
}

#[test]
fn http_request_is_not_mistaken_for_a_message() {
    // "GET / HTTP/1.1" read as a length is ~1.3 GB: refused, not allocated.
    assert!(read_frame(&b"GET / HTTP/1.1\r\n\r\n"[..]).is_err());
}

#[test]
fn a_look_encodes_its_keys_in_order_and_its_answer_marks_what_is_unset() {
    let look = Request::Look {
        keys: vec!["ab".into(), "c".into()],
    };
    let mut expected = vec![LOOK];
    expected.extend_from_slice(&2_u64.to_le_bytes());
    expected.extend_from_slice(&[2, 0, 0, 0, b'a', b'b', 1, 0, 0, 0, b'c']);
    assert_eq!(look.encode(), expected);
    let values = Response::Values(vec![None, Some(vec![9])]);
    let mut expected = vec![VALUES];
    expected.extend_from_slice(&2_u64.to_le_bytes());
    expected.extend_from_slice(&[UNSET, SET_VALUE, 1, 0, 0, 0, 9]);
    assert_eq!(values.encode(), expected);
    // Cut anywhere, or with a byte more, neither decodes.
    let (look, values) = (look.encode(), values.encode());
    for cut in 0..look.len() {
        assert!(Request::decode(&look[..cut]).is_err(), "{cut}-byte look");
    }
    for cut in 0..values.len() {
        assert!(
            Response::decode(&values[..cut]).is_err(),
            "{cut}-byte answer"
        );
    }
    assert!(Request::decode(&[&look[..], &[0]].concat()).is_err());
    assert!(Response::decode(&[&values[..], &[0]].concat()).is_err());
}

#[test]
fn a_look_past_its_key_limit_or_its_bytes_is_refused_before_allocating() {
    let keys = |n: usize| Request::Look {
        keys: vec![String::new(); n],
    };
    assert!(Request::decode(&keys(MAX_LOOK_KEYS).encode()).is_ok());
    let err = Request::decode(&keys(MAX_LOOK_KEYS + 1).encode()).unwrap_err();
    assert!(
        err.to_string().contains("65 keys exceeds the 64-key limit"),
        "{err}"
    );
    // A count within the limit that the bytes left cannot hold: a key
    // takes 4 bytes at least, a value 1.
    let claim =
        |tag: u8, count: u64, rest: &[u8]| [&[tag][..], &count.to_le_bytes(), rest].concat();
    let err = Request::decode(&claim(LOOK, 3, &[0; 11])).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    let err = Response::decode(&claim(VALUES, 3, &[UNSET; 2])).unwrap_err();
    assert!(err.to_string().contains("truncated"), "{err}");
    for huge in [u64::MAX, 1 << 40] {
        assert!(Request::decode(&claim(LOOK, huge, &[0; 8])).is_err());
        assert!(Response::decode(&claim(VALUES, huge, &[UNSET; 8])).is_err());
    }
    let err = Response::decode(&claim(VALUES, 1, &[2])).unwrap_err();
    assert!(err.to_string().contains("unknown value mark 2"), "{err}");
}
