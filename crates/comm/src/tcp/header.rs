//! The 32-byte header every rank sends to its right neighbour at the start
//! of each collective. The receiver compares it with its own: a rank that
//! called a different collective, another length, type, op or root, or that
//! skipped a call, is reported as a mismatch instead of silently mixing
//! unrelated bytes into the result.

use crate::communicator::ReduceOp;
use crate::tcp::element::Dtype;

pub(crate) const HEADER_BYTES: usize = 32;
const MAGIC: [u8; 4] = *b"CMHD";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce(ReduceOp),
    Broadcast {
        root: usize,
    },
    Barrier,
    /// A point-to-point message from ring rank `from` (not a collective).
    Send {
        from: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    pub(crate) dtype: Dtype,
    pub(crate) count: usize,
    /// Position of this collective in the communicator's life.
    pub(crate) seq: u64,
}

impl Header {
    pub(crate) fn encode(&self) -> [u8; HEADER_BYTES] {
        let (kind, op, root) = match self.kind {
            Kind::AllReduce(ReduceOp::Sum) => (1, 1, 0),
            Kind::AllReduce(ReduceOp::Avg) => (1, 2, 0),
            Kind::Broadcast { root } => (2, 0, root as u64),
            Kind::Barrier => (3, 0, 0),
            Kind::Send { from } => (4, 0, from as u64),
        };
        let dtype = self.dtype.code();
        let mut out = [0_u8; HEADER_BYTES];
        out[..4].copy_from_slice(&MAGIC);
        out[4] = kind;
        out[5] = op;
        out[6] = dtype;
        out[8..16].copy_from_slice(&(self.count as u64).to_le_bytes());
        out[16..24].copy_from_slice(&root.to_le_bytes());
        out[24..32].copy_from_slice(&self.seq.to_le_bytes());
        out
    }

    /// `None` when the bytes are not a header at all (the stream is out of
    /// step, or the peer is not a comm rank).
    pub(crate) fn decode(bytes: &[u8; HEADER_BYTES]) -> Option<Header> {
        if bytes[..4] != MAGIC || bytes[7] != 0 {
            return None;
        }
        let word = |at: usize| {
            let mut w = [0_u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(w)
        };
        let root = usize::try_from(word(16)).ok()?;
        let kind = match (bytes[4], bytes[5]) {
            (1, 1) if root == 0 => Kind::AllReduce(ReduceOp::Sum),
            (1, 2) if root == 0 => Kind::AllReduce(ReduceOp::Avg),
            (2, 0) => Kind::Broadcast { root },
            (3, 0) if root == 0 => Kind::Barrier,
            (4, 0) => Kind::Send { from: root },
            _ => return None,
        };
        let dtype = Dtype::from_code(bytes[6])?;
        Some(Header {
            kind,
            dtype,
            count: usize::try_from(word(8)).ok()?,
            seq: word(24),
        })
    }

    /// Human-readable form for mismatch errors.
    pub(crate) fn describe(&self) -> String {
        let what = match self.kind {
            Kind::AllReduce(op) => {
                let op = match op {
                    ReduceOp::Sum => "sum",
                    ReduceOp::Avg => "avg",
                };
                format!("all_reduce({} x {}, {op})", self.dtype.name(), self.count)
            }
            Kind::Broadcast { root } => format!(
                "broadcast({} x {}, root {root})",
                self.dtype.name(),
                self.count
            ),
            Kind::Barrier => "barrier".to_string(),
            Kind::Send { from } => {
                return format!(
                    "send({} x {}) as message #{} from ring rank {from}",
                    self.dtype.name(),
                    self.count,
                    self.seq
                );
            }
        };
        format!("{what} as collective #{}", self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> [Header; 5] {
        [
            Header {
                kind: Kind::AllReduce(ReduceOp::Sum),
                dtype: Dtype::F32,
                count: 1 << 40,
                seq: 7,
            },
            Header {
                kind: Kind::AllReduce(ReduceOp::Avg),
                dtype: Dtype::F64,
                count: 0,
                seq: u64::MAX,
            },
            Header {
                kind: Kind::Broadcast { root: 3 },
                dtype: Dtype::F32,
                count: 5,
                seq: 1,
            },
            Header {
                kind: Kind::Barrier,
                dtype: Dtype::F64,
                count: 4,
                seq: 2,
            },
            Header {
                kind: Kind::Send { from: 1 },
                dtype: Dtype::F32,
                count: 9,
                seq: 3,
            },
        ]
    }

    #[test]
    fn headers_round_trip() {
        for h in all_kinds() {
            assert_eq!(Header::decode(&h.encode()), Some(h));
        }
    }

    #[test]
    fn foreign_bytes_are_not_a_header() {
        assert_eq!(Header::decode(&[0; HEADER_BYTES]), None);
        let mut bad_kind = all_kinds()[0].encode();
        bad_kind[4] = 9;
        assert_eq!(Header::decode(&bad_kind), None);
    }

    #[test]
    fn description_names_call_and_position() {
        assert_eq!(
            all_kinds()[0].describe(),
            "all_reduce(f32 x 1099511627776, sum) as collective #7"
        );
        assert_eq!(
            all_kinds()[2].describe(),
            "broadcast(f32 x 5, root 3) as collective #1"
        );
        assert_eq!(
            all_kinds()[4].describe(),
            "send(f32 x 9) as message #3 from ring rank 1"
        );
    }
}
