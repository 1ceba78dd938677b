//! [`LocalCommunicator`]: the ranks of one process, as threads, meeting in
//! shared memory instead of sockets: no ports, no store, no copies through
//! the kernel. Results are bitwise those of the TCP ring ([`ring_sum`]
//! adds in the ring's order), so a job gives the same numbers whether its
//! ranks are threads or processes.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use half::{bf16, f16};

use crate::communicator::{Communicator, HalfFormat, IntReduce, ReduceOp, check_peers, check_root};
use crate::error::CommError;
use crate::tcp::element::{Dtype, Element, Largest, WrappingSum, through};
use crate::tcp::group::Group;
use crate::tcp::header::{Header, Kind};
use crate::tcp::ring_all_reduce::BLOCK_PART_BYTES;

/// What peers are called in errors: they have no address.
const HERE: &str = "a thread of this process";

/// One rank of a job whose ranks are threads of this process; made by
/// [`LocalCommunicator::job`]. Collectives wait at most the job's timeout
/// for the other ranks, and a rank that dropped its communicator is
/// reported as lost at once.
#[derive(Debug)]
pub struct LocalCommunicator {
    rank: usize,
    board: Arc<Board>,
    /// Sub-groups made from this communicator so far.
    groups_made: u64,
}

/// Where the ranks of one job (or sub-group) meet.
#[derive(Debug)]
struct Board {
    world: usize,
    timeout: Duration,
    state: Mutex<State>,
    changed: Condvar,
    /// Sub-groups made from this board, by member list and number.
    groups: Mutex<HashMap<String, Arc<Board>>>,
}

type Shared = Arc<dyn Any + Send + Sync>;

#[derive(Debug, Default)]
struct State {
    /// This round's contributions, per rank.
    posts: Vec<Option<(Header, Shared)>>,
    /// The round's result, once every rank posted: the data, or every
    /// rank's header when they disagree.
    result: Option<Result<Shared, Vec<Header>>>,
    /// Per rank: whether it took the result.
    took: Vec<bool>,
    round: u64,
    /// Messages in flight, by (from, to).
    mailboxes: HashMap<(usize, usize), VecDeque<Vec<f32>>>,
    /// Ranks whose communicator is gone.
    left: Vec<bool>,
    /// Why the job is broken, after a timeout.
    failed: Option<String>,
}

impl Board {
    fn new(world: usize, timeout: Duration) -> Arc<Board> {
        Arc::new(Board {
            world,
            timeout,
            state: Mutex::new(State {
                posts: vec![None; world],
                took: vec![false; world],
                left: vec![false; world],
                ..State::default()
            }),
            changed: Condvar::new(),
            groups: Mutex::new(HashMap::new()),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until `ready` holds; `lost` names a rank that is gone and was
    /// awaited, `awaited` the rank to blame for a timeout.
    fn wait_until<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        op: &'static str,
        ready: impl Fn(&State) -> bool,
        lost: impl Fn(&State) -> Option<usize>,
        awaited: impl Fn(&State) -> usize,
    ) -> Result<MutexGuard<'a, State>, CommError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(why) = &state.failed {
                return Err(CommError::Broken(why.clone()));
            }
            if ready(&state) {
                return Ok(state);
            }
            if let Some(peer) = lost(&state) {
                return Err(CommError::PeerLost {
                    peer,
                    addr: HERE.to_string(),
                    op,
                    detail: "its communicator was dropped (the rank ended)".to_string(),
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let err = CommError::PeerTimeout {
                    peer: awaited(&state),
                    addr: HERE.to_string(),
                    op,
                    timeout: self.timeout,
                };
                state.failed = Some(err.to_string());
                self.changed.notify_all();
                return Err(err);
            }
            state = self
                .changed
                .wait_timeout(state, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

impl LocalCommunicator {
    /// The `world_size` ranks of a new job, in rank order, each to be moved
    /// to its own thread. Every wait is bounded by `timeout`.
    pub fn job(world_size: usize, timeout: Duration) -> Vec<LocalCommunicator> {
        let board = Board::new(world_size, timeout);
        (0..world_size)
            .map(|rank| LocalCommunicator {
                rank,
                board: board.clone(),
                groups_made: 0,
            })
            .collect()
    }

    /// Posts this rank's `data` for a collective described by `kind` and
    /// `count`; the last rank to post runs `combine` over every rank's
    /// data. Returns the result, shared by all ranks.
    fn collective<T: Element>(
        &mut self,
        op: &'static str,
        kind: Kind,
        data: Vec<T>,
        combine: impl FnOnce(&[&[T]]) -> Vec<T>,
    ) -> Result<Arc<Vec<T>>, CommError> {
        let (rank, world) = (self.rank, self.board.world);
        let board = &self.board;
        let state = board.lock();
        let mut state = board.wait_until(
            state,
            op,
            |s| s.posts[rank].is_none() && s.result.is_none(),
            |s| (0..world).find(|&r| s.result.is_some() && !s.took[r] && s.left[r]),
            |s| first_missing(s, |s, r| s.result.is_some() && !s.took[r]),
        )?;
        let header = Header {
            kind,
            dtype: T::DTYPE,
            count: data.len(),
            seq: state.round + 1,
        };
        state.posts[rank] = Some((header, Arc::new(data)));
        if state.posts.iter().all(Option::is_some) {
            let headers: Vec<Header> = state.posts.iter().flatten().map(|p| p.0).collect();
            state.result = Some(if headers.iter().all(|h| *h == headers[0]) {
                let shared: Vec<&Vec<T>> = state
                    .posts
                    .iter()
                    .flatten()
                    .filter_map(|p| p.1.downcast_ref::<Vec<T>>())
                    .collect();
                let slices: Vec<&[T]> = shared.iter().map(|v| v.as_slice()).collect();
                Ok(Arc::new(combine(&slices)) as Shared)
            } else {
                Err(headers)
            });
            board.changed.notify_all();
        }
        let mut state = board.wait_until(
            state,
            op,
            |s| s.result.is_some(),
            |s| (0..world).find(|&r| s.posts[r].is_none() && s.left[r]),
            |s| first_missing(s, |s, r| s.posts[r].is_none()),
        )?;
        let result = state.result.clone().unwrap_or_else(|| Err(Vec::new()));
        state.took[rank] = true;
        if state.took.iter().all(|&t| t) {
            state.posts.iter_mut().for_each(|p| *p = None);
            state.took.iter_mut().for_each(|t| *t = false);
            state.result = None;
            state.round += 1;
            board.changed.notify_all();
        }
        match result {
            Ok(shared) => shared
                .downcast::<Vec<T>>()
                .map_err(|_| CommError::Broken("a collective's result has another type".into())),
            Err(headers) => {
                let (peer, theirs) = headers
                    .iter()
                    .enumerate()
                    .find(|(_, h)| **h != header)
                    .map_or((rank, header), |(r, h)| (r, *h));
                Err(CommError::CollectiveMismatch {
                    peer,
                    ours: header.describe(),
                    theirs: theirs.describe(),
                })
            }
        }
    }

    fn all_reduce_elements<T: Element>(
        &mut self,
        buf: &mut [T],
        op: ReduceOp,
    ) -> Result<(), CommError> {
        if self.board.world == 1 {
            return Ok(());
        }
        let sum = self.collective("all_reduce", Kind::AllReduce(op), buf.to_vec(), |all| {
            ring_sum(all, op)
        })?;
        buf.copy_from_slice(&sum);
        Ok(())
    }

    /// See [`Communicator::subgroup`]; sub-groups of sub-groups work too.
    pub fn subgroup(&mut self, members: &[usize]) -> Result<LocalCommunicator, CommError> {
        self.groups_made += 1;
        let group = Group::sub(self.groups_made, members, self.rank, self.board.world)?;
        let key = format!("{}/{members:?}", self.groups_made);
        let board = self
            .board
            .groups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(key)
            .or_insert_with(|| Board::new(group.world(), self.board.timeout))
            .clone();
        let mut comm = LocalCommunicator {
            rank: group.rank,
            board,
            groups_made: 0,
        };
        comm.barrier()?;
        Ok(comm)
    }
}

/// The first rank for which `missing` holds, to blame for a timeout.
fn first_missing(state: &State, missing: impl Fn(&State, usize) -> bool) -> usize {
    (0..state.left.len())
        .find(|&r| missing(state, r))
        .unwrap_or(0)
}

/// The ring all-reduce's sum, bit for bit: the buffer in blocks of `world`
/// parts (split as the ring splits them), part `q` summed starting from
/// rank `q`'s value, each next rank's value added in front, and an average
/// multiplied by `1 / world` once at the end.
pub(crate) fn ring_sum<T: Element>(all: &[&[T]], op: ReduceOp) -> Vec<T> {
    let world = all.len();
    let len = all[0].len();
    let mut out = all[0].to_vec();
    let block_len = (BLOCK_PART_BYTES / size_of::<T>()).max(1) * world;
    let scale = T::reciprocal(world);
    let mut offset = 0;
    while offset < len {
        let this_block = block_len.min(len - offset);
        let (base, extra) = (this_block / world, this_block % world);
        let mut start = offset;
        for q in 0..world {
            let end = start + base + usize::from(q < extra);
            for (i, o) in out[start..end]
                .iter_mut()
                .enumerate()
                .map(|(i, o)| (start + i, o))
            {
                let mut acc = all[q][i];
                for k in 1..world {
                    acc = all[(q + k) % world][i] + acc;
                }
                *o = match (op, scale) {
                    (ReduceOp::Avg, Some(scale)) => acc * scale,
                    _ => acc,
                };
            }
            start = end;
        }
        offset += this_block;
    }
    out
}

impl Drop for LocalCommunicator {
    fn drop(&mut self) {
        let mut state = self.board.lock();
        state.left[self.rank] = true;
        self.board.changed.notify_all();
    }
}

impl Communicator for LocalCommunicator {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.board.world
    }

    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce_elements(buf, op)
    }

    fn all_reduce_f64(&mut self, buf: &mut [f64], op: ReduceOp) -> Result<(), CommError> {
        self.all_reduce_elements(buf, op)
    }

    fn all_reduce_i64(&mut self, buf: &mut [i64], op: IntReduce) -> Result<(), CommError> {
        match op {
            IntReduce::Sum => {
                let buf: &mut [WrappingSum] = bytemuck::cast_slice_mut(buf);
                self.all_reduce_elements(buf, ReduceOp::Sum)
            }
            IntReduce::Max => {
                let buf: &mut [Largest] = bytemuck::cast_slice_mut(buf);
                self.all_reduce_elements(buf, ReduceOp::Sum)
            }
        }
    }

    fn all_reduce_half(
        &mut self,
        buf: &mut [f32],
        op: ReduceOp,
        format: HalfFormat,
    ) -> Result<(), CommError> {
        match format {
            HalfFormat::Bf16 => through::<bf16, _>(buf, |w| self.all_reduce_elements(w, op)),
            HalfFormat::Fp16 => through::<f16, _>(buf, |w| self.all_reduce_elements(w, op)),
        }
    }

    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> Result<(), CommError> {
        check_root(root, self.board.world)?;
        if self.board.world == 1 {
            return Ok(());
        }
        let kind = Kind::Broadcast { root };
        let copy = self.collective("broadcast", kind, buf.to_vec(), |all| all[root].to_vec())?;
        buf.copy_from_slice(&copy);
        Ok(())
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        if self.board.world == 1 {
            return Ok(());
        }
        let token = vec![0.0_f64; self.board.world];
        self.collective("barrier", Kind::Barrier, token, |all| all[0].to_vec())
            .map(drop)
    }

    fn send_recv(
        &mut self,
        send: Option<(&[f32], usize)>,
        recv: Option<(&mut [f32], usize)>,
    ) -> Result<(), CommError> {
        let (rank, world) = (self.rank, self.board.world);
        check_peers(
            rank,
            world,
            [send.as_ref().map(|s| s.1), recv.as_ref().map(|r| r.1)],
        )?;
        let board = &self.board;
        if let Some((buf, to)) = send {
            let mut state = board.lock();
            state
                .mailboxes
                .entry((rank, to))
                .or_default()
                .push_back(buf.to_vec());
            board.changed.notify_all();
        }
        let Some((buf, from)) = recv else {
            return Ok(());
        };
        let has_mail = |s: &State| {
            s.mailboxes
                .get(&(from, rank))
                .is_some_and(|m| !m.is_empty())
        };
        let state = board.lock();
        let mut state = board.wait_until(
            state,
            "recv",
            has_mail,
            |s| s.left[from].then_some(from),
            |_| from,
        )?;
        let message = state
            .mailboxes
            .get_mut(&(from, rank))
            .and_then(VecDeque::pop_front)
            .unwrap_or_default();
        if message.len() != buf.len() {
            let describe = |count| Header {
                kind: Kind::Send { from },
                dtype: Dtype::F32,
                count,
                seq: 0,
            };
            return Err(CommError::CollectiveMismatch {
                peer: from,
                ours: describe(buf.len()).describe(),
                theirs: describe(message.len()).describe(),
            });
        }
        buf.copy_from_slice(&message);
        Ok(())
    }

    fn subgroup(&mut self, members: &[usize]) -> Result<Box<dyn Communicator>, CommError> {
        Ok(Box::new(LocalCommunicator::subgroup(self, members)?))
    }
}
