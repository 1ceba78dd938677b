//! Fuzz targets for the decoders that read bytes from the network: the
//! store's frames and messages, and the ring's collective header. They run
//! as ordinary tests with a bounded number of cases (CI stays fast), each
//! case a valid input from the corpus in `tests/corpus/` with a few bytes
//! overwritten, cut off or spliced in, or plain random bytes. Beyond "never
//! panics", every decoder is canonical: whatever it accepts, re-encoding
//! gives back exactly the bytes it read, so no two inputs mean the same
//! thing and nothing is silently skipped.

use proptest::prelude::*;

use crate::store_protocol::{MAX_FRAME, Request, Response, read_frame};
use crate::tcp::header::{HEADER_BYTES, Header};

/// Valid store payloads (tag byte onwards), one per message kind.
const STORE_CORPUS: [&[u8]; 11] = [
    include_bytes!("../tests/corpus/store/hello.bin"),
    include_bytes!("../tests/corpus/store/set.bin"),
    include_bytes!("../tests/corpus/store/get.bin"),
    include_bytes!("../tests/corpus/store/poison_ranks_missing.bin"),
    include_bytes!("../tests/corpus/store/ok.bin"),
    include_bytes!("../tests/corpus/store/value.bin"),
    include_bytes!("../tests/corpus/store/not_found.bin"),
    include_bytes!("../tests/corpus/store/rejected_world_size.bin"),
    include_bytes!("../tests/corpus/store/rejected_duplicate.bin"),
    include_bytes!("../tests/corpus/store/look.bin"),
    include_bytes!("../tests/corpus/store/values.bin"),
];

/// Valid ring headers, one per collective kind.
const HEADER_CORPUS: [&[u8; HEADER_BYTES]; 4] = [
    include_bytes!("../tests/corpus/ring_header/all_reduce_sum.bin"),
    include_bytes!("../tests/corpus/ring_header/all_reduce_avg.bin"),
    include_bytes!("../tests/corpus/ring_header/broadcast.bin"),
    include_bytes!("../tests/corpus/ring_header/barrier.bin"),
];

/// Cases per target: decodes of small inputs take microseconds, so this is
/// about a tenth of a second each.
const CASES: u32 = 32_768;

/// How a corpus entry is damaged: bytes overwritten at (wrapped) positions,
/// then a slice spliced in at a position, then the tail cut.
#[derive(Debug, Clone)]
struct Damage {
    writes: Vec<(usize, u8)>,
    splice: (usize, Vec<u8>),
    keep: usize,
}

impl Damage {
    fn apply(&self, seed: &[u8]) -> Vec<u8> {
        let mut bytes = seed.to_vec();
        for &(at, byte) in &self.writes {
            if let Some(slot) = bytes.len().checked_sub(1).map(|last| at % (last + 1)) {
                bytes[slot] = byte;
            }
        }
        let (at, inserted) = &self.splice;
        let at = at % (bytes.len() + 1);
        bytes.splice(at..at, inserted.iter().copied());
        bytes.truncate(self.keep);
        bytes
    }
}

fn damage() -> impl Strategy<Value = Damage> {
    (
        proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 0..12),
        ),
        prop_oneof![Just(usize::MAX), any::<usize>().prop_map(|n| n % 64)],
    )
        .prop_map(|(writes, splice, keep)| Damage {
            writes,
            splice,
            keep,
        })
}

/// A damaged corpus entry or, one time in four, random bytes.
fn input(corpus: &'static [&'static [u8]]) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => (0..corpus.len(), damage()).prop_map(move |(seed, d)| d.apply(corpus[seed])),
        1 => proptest::collection::vec(any::<u8>(), 0..96),
    ]
}

fn header_corpus() -> &'static [&'static [u8]] {
    const AS_SLICES: [&[u8]; 4] = [
        HEADER_CORPUS[0],
        HEADER_CORPUS[1],
        HEADER_CORPUS[2],
        HEADER_CORPUS[3],
    ];
    &AS_SLICES
}

#[test]
fn corpus_entries_decode() {
    for payload in STORE_CORPUS {
        let request = Request::decode(payload).map(|r| r.encode());
        let response = Response::decode(payload).map(|r| r.encode());
        assert!(
            request.ok().as_deref() == Some(payload) || response.ok().as_deref() == Some(payload),
            "{payload:?}"
        );
    }
    for header in HEADER_CORPUS {
        assert_eq!(Header::decode(header).map(|h| h.encode()), Some(*header));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(CASES))]

    #[test]
    fn store_requests_decode_canonically(payload in input(&STORE_CORPUS)) {
        if let Ok(request) = Request::decode(&payload) {
            prop_assert_eq!(request.encode(), payload);
        }
    }

    #[test]
    fn store_responses_decode_canonically(payload in input(&STORE_CORPUS)) {
        if let Ok(response) = Response::decode(&payload) {
            prop_assert_eq!(response.encode(), payload);
        }
    }

    #[test]
    fn store_frames_take_exactly_their_length(
        payload in input(&STORE_CORPUS),
        announced in prop_oneof![Just(None), any::<u32>().prop_map(Some)],
    ) {
        let len = announced.unwrap_or(u32::try_from(payload.len()).unwrap_or(u32::MAX));
        let mut wire = len.to_le_bytes().to_vec();
        wire.extend_from_slice(&payload);
        match read_frame(&wire[..]) {
            Ok(read) => {
                prop_assert!(read.len() <= MAX_FRAME);
                prop_assert_eq!(&read[..], &payload[..len as usize]);
            }
            Err(_) => prop_assert!(len as usize > MAX_FRAME.min(payload.len())),
        }
    }

    #[test]
    fn ring_headers_decode_canonically(bytes in input(header_corpus())) {
        if let Ok(exact) = <[u8; HEADER_BYTES]>::try_from(&bytes[..])
            && let Some(header) = Header::decode(&exact)
        {
            prop_assert_eq!(header.encode(), exact);
        }
    }
}
