//! The seam between the trainer and a transport.
//!
//! The trait speaks host (`&mut [f32]`) slices. Collectives on device
//! buffers are [`crate::nccl::NcclCommunicator`]'s: asynchronous, queued on
//! a CUDA stream, which a blocking host-slice trait cannot express.

use crate::error::CommError;

/// How values from all ranks are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum over ranks.
    Sum,
    /// Element-wise sum over ranks, then multiplied by `1 / world_size`
    /// (the same multiplication on every rank, so results stay bitwise
    /// identical).
    Avg,
}

/// How 64-bit integers combine across ranks: both exactly, so the result
/// does not depend on the order or grouping in which a transport meets the
/// ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntReduce {
    /// The two's complement sum, wrapping on overflow: associative and
    /// commutative even then, so a sum whose true value fits in an i64 is
    /// exact, however its terms were grouped.
    Sum,
    /// The largest value.
    Max,
}

/// A 16-bit float format values may travel in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfFormat {
    /// bfloat16: float32's exponent range, 8 bits of precision.
    Bf16,
    /// IEEE binary16: 11 bits of precision, largest finite 65504.
    Fp16,
}

impl std::fmt::Display for HalfFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HalfFormat::Bf16 => "bf16",
            HalfFormat::Fp16 => "fp16",
        })
    }
}

/// Collective operations among the ranks of one job.
///
/// Every rank must call the same collectives in the same order with the same
/// lengths (and the same `root`). All results are bitwise identical on every
/// rank: the trainer relies on that to keep replicas in lockstep.
///
/// Object safe, so the trainer can hold a `Box<dyn Communicator>` and pick
/// the transport at run time.
pub trait Communicator: Send {
    /// This process's rank, `0..world_size()`.
    fn rank(&self) -> usize;

    /// Number of ranks in the job.
    fn world_size(&self) -> usize;

    /// Reduces `buf` across all ranks, in place.
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError>;

    /// Reduces `buf` across all ranks, in place, carried as `format`: each
    /// rank's values rounded to 16 bits, summed in f32 hop by hop with one
    /// rounding to 16 bits each (see `tcp/element.rs`), the result decoded
    /// back. Half the bytes of [`Communicator::all_reduce`], and bitwise
    /// identical on every rank. Transports without 16-bit elements refuse.
    fn all_reduce_half(
        &mut self,
        _buf: &mut [f32],
        _op: ReduceOp,
        format: HalfFormat,
    ) -> Result<(), CommError> {
        Err(CommError::InvalidArgument {
            op: "all_reduce_half",
            reason: format!("this transport cannot carry {format} elements"),
        })
    }

    /// Reduces `buf` across all ranks as `op` says, in place, exactly (see
    /// [`IntReduce`]). Transports without integer elements refuse.
    fn all_reduce_i64(&mut self, _buf: &mut [i64], op: IntReduce) -> Result<(), CommError> {
        Err(CommError::InvalidArgument {
            op: "all_reduce_i64",
            reason: format!("this transport cannot reduce integers ({op:?})"),
        })
    }

    /// Reduces `buf` across all ranks in f64, in place. Meant for small
    /// metric vectors (loss sums, correct counts) that must add up exactly.
    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError>;

    /// Overwrites `buf` on every rank with `buf` of rank `root`.
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError>;

    /// Returns once every rank has entered the barrier.
    fn barrier(&mut self) -> Result<(), CommError>;

    /// Gathers every rank's `send`, whose lengths may differ between ranks,
    /// into one vector per rank in rank order; the result is identical on
    /// every rank. The lengths travel first (an exact f64 all-reduce), then
    /// each rank's data is broadcast from it in rank order (ranks sending
    /// nothing are skipped), so each element crosses every ring link once:
    /// the bytes of a ring all-gather, through the transport's broadcast.
    fn all_gather_v(&mut self, send: &[f32]) -> Result<Vec<Vec<f32>>, CommError> {
        let (rank, world) = (self.rank(), self.world_size());
        let mut counts = vec![0.0_f64; world];
        // Exact: lengths are integers far below 2^53, summed with zeros.
        counts[rank] = send.len() as f64;
        self.all_reduce_f64(&mut counts, ReduceOp::Sum)?;
        let mut gathered = Vec::with_capacity(world);
        for (root, &count) in counts.iter().enumerate() {
            let mut buf = if root == rank {
                send.to_vec()
            } else {
                vec![0.0; count as usize]
            };
            if !buf.is_empty() {
                self.broadcast(&mut buf, root)?;
            }
            gathered.push(buf);
        }
        Ok(gathered)
    }

    // ---- Point to point and sub-groups (pipeline parallelism) ----

    /// Sends `send.0` to rank `send.1` and receives `recv.0` from rank
    /// `recv.1`, both at once (either may be `None`), so neighbours that
    /// exchange in both directions cannot deadlock. The peers must be
    /// neighbours (rank ± 1, wrapping) and the receiver must expect
    /// exactly the length sent; a mismatch is an error, not garbage.
    fn send_recv(
        &mut self,
        send: Option<(&[f32], usize)>,
        recv: Option<(&mut [f32], usize)>,
    ) -> Result<(), CommError>;

    /// A communicator over `members` (ranks of this communicator, distinct
    /// and ascending; this rank among them), numbered by their position
    /// in `members`. Every member calls it, for the same list, after the
    /// same number of earlier `subgroup` calls on this communicator.
    fn subgroup(&mut self, members: &[usize]) -> Result<Box<dyn Communicator>, CommError>;

    // ---- End of point to point and sub-groups ----
}

/// Refuses a `send_recv` whose peers (`send` and `recv`, where present) are
/// not other ranks of a group of `world_size`, before anything moves.
pub(crate) fn check_peers(
    rank: usize,
    world_size: usize,
    peers: [Option<usize>; 2],
) -> Result<(), CommError> {
    match peers
        .into_iter()
        .flatten()
        .find(|&p| p >= world_size || p == rank)
    {
        Some(peer) => Err(CommError::InvalidArgument {
            op: "send_recv",
            reason: format!("rank {peer} is not another rank of a group of {world_size}"),
        }),
        None => Ok(()),
    }
}

/// Refuses a broadcast `root` outside a world of `world_size` before
/// anything is sent: every rank fails at once, instead of waiting on a root
/// that does not exist.
pub(crate) fn check_root(root: usize, world_size: usize) -> Result<(), CommError> {
    if root < world_size {
        Ok(())
    } else {
        Err(CommError::InvalidArgument {
            op: "broadcast",
            reason: format!("root {root} is not a rank of a world of size {world_size}"),
        })
    }
}
