//! Where a run starts, and how every rank comes to start from the same
//! place: rank 0 decides (it alone reads files, which other hosts may not
//! see) and broadcasts the whole starting state. A fresh optimizer is just
//! zero moments at step 0, so every start travels the same way.

use anyhow::{Context, anyhow, bail};

use super::{HookState, Position, TrainingState};
use crate::comm_thread::CommThread;

/// Rank 0's choice of where training starts.
pub enum Origin {
    /// Seeded initialization.
    Fresh,
    /// Given weights (`--init-from`), with a fresh optimizer.
    Weights(Vec<f32>),
    /// A checkpoint: weights, optimizer and position.
    Resume(Box<TrainingState>),
}

/// What one rank starts from: the same on every rank except for its own
/// share of the current epoch's running metrics.
pub struct Start {
    pub params: Vec<f32>,
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
    pub optimizer_step: u64,
    pub position: Position,
    pub epoch_loss_sum: f32,
    pub epoch_correct: f32,
    /// Rank 0's training time so far in the epoch.
    pub epoch_train_seconds: f64,
    /// Samples of the epoch's order visited so far, and by how many
    /// replicas (the checkpoint's layout; see [`crate::data::Resumed`]).
    pub epoch_visited: (u64, u64),
    /// `--comm-hook powersgd`'s state as this rank continues it.
    pub hook: Option<HookStart>,
    /// The bytes rank 0's broadcast of this start carried to each rank
    /// (zero for a lone rank): what a live job's heal costs the ring.
    pub broadcast_bytes: u64,
}

/// PowerSGD's state as one rank continues it: the `Q`s (every rank's) and
/// its own error feedback (empty: zeros, as at the start).
#[derive(Clone, Debug, PartialEq)]
pub struct HookStart {
    pub q: Vec<(String, [usize; 2], Vec<f32>)>,
    pub error: Vec<f32>,
}

/// Turns rank 0's `origin` into every rank's [`Start`]: directly for a lone
/// rank, by broadcast otherwise. Other ranks pass [`Origin::Fresh`], which
/// the broadcast overwrites. `init` draws the seeded initial parameters
/// (`param_count` of them). That every rank has rank 0's seed and batch
/// size (and the other flags a job shares) was checked before, by
/// `train::SharedSettings`, whose check names the flag that differs.
pub fn agree(
    origin: Origin,
    comm: Option<&mut CommThread>,
    init: impl FnOnce() -> Vec<f32>,
    param_count: usize,
) -> anyhow::Result<Start> {
    let (rank, world_size) = comm.as_ref().map_or((0, 1), |c| (c.rank(), c.world_size()));
    let mut state = Shared::new(origin, init, world_size)?;
    // Every rank must broadcast buffers of the same lengths.
    for (what, len) in [
        ("parameters", state.params.len()),
        ("exp_avg", state.exp_avg.len()),
        ("exp_avg_sq", state.exp_avg_sq.len()),
    ] {
        if len != param_count {
            bail!("the starting {what} hold {len} values; this model has {param_count}");
        }
    }
    let bytes = match comm {
        Some(comm) => state.broadcast(comm)?,
        None => 0,
    };
    Ok(Start {
        broadcast_bytes: bytes,
        ..state.start(rank)
    })
}

/// The state as it travels: every rank's share of the epoch metrics.
struct Shared {
    position: Position,
    optimizer_step: u64,
    /// Samples of the epoch's order visited, and by how many replicas.
    visited: (u64, u64),
    params: Vec<f32>,
    exp_avg: Vec<f32>,
    exp_avg_sq: Vec<f32>,
    /// Loss sums of ranks `0..world_size`, then their correct counts.
    epoch_metrics: Vec<f32>,
    epoch_train_seconds: f64,
    /// PowerSGD's `Q`s and every rank's error (empty: zeros).
    hook: Option<HookState>,
}

impl Shared {
    fn new(
        origin: Origin,
        init: impl FnOnce() -> Vec<f32>,
        world_size: usize,
    ) -> anyhow::Result<Self> {
        let fresh = |params: Vec<f32>| Self {
            position: Position::START,
            optimizer_step: 0,
            visited: (0, 1),
            exp_avg: vec![0.0; params.len()],
            exp_avg_sq: vec![0.0; params.len()],
            params,
            epoch_metrics: vec![0.0; 2 * world_size],
            epoch_train_seconds: 0.0,
            hook: None,
        };
        Ok(match origin {
            Origin::Fresh => fresh(init()),
            Origin::Weights(params) => fresh(params),
            Origin::Resume(state) => {
                let visited = (state.visited(), state.settings.replicas() as u64);
                Self {
                    epoch_metrics: epoch_metrics(&state, world_size)?,
                    visited,
                    position: state.position,
                    optimizer_step: state.optimizer_step,
                    params: state.params,
                    exp_avg: state.exp_avg,
                    exp_avg_sq: state.exp_avg_sq,
                    epoch_train_seconds: state.epoch_train_seconds,
                    hook: state.hook,
                }
            }
        })
    }

    /// Overwrites this rank's copy with rank 0's; the bytes that took.
    fn broadcast(&mut self, comm: &mut CommThread) -> anyhow::Result<u64> {
        let mut hook = self.hook.take().map(HookParts::of);
        let hook_lens = hook.as_ref().map_or([0; 3], HookParts::lens);
        let (position, (visited, by)) = (self.position, self.visited);
        let mut header = encode(&[
            position.epoch,
            position.step,
            self.optimizer_step,
            visited,
            by,
            hook_lens[0],
            hook_lens[1],
            hook_lens[2],
        ]);
        comm.broadcast(&mut header, 0)
            .context("receiving rank 0's starting point")?;
        let mut values = header.len();
        let [epoch, step, optimizer_step, visited, by, names, q, errors] = decode(&header)?;
        (self.position, self.optimizer_step) = (Position { epoch, step }, optimizer_step);
        self.visited = (visited, by);
        if names > 0 {
            let parts = hook.get_or_insert_with(|| HookParts::sized([names, q, errors]));
            for buf in [&mut parts.names, &mut parts.q, &mut parts.errors] {
                comm.broadcast(buf, 0)
                    .context("receiving rank 0's PowerSGD state")?;
                values += buf.len();
            }
        }
        self.hook = hook.map(HookParts::state).transpose()?;
        for (buf, what) in [
            (&mut self.params, "parameters"),
            (&mut self.exp_avg, "Adam moments"),
            (&mut self.exp_avg_sq, "Adam moments"),
            (&mut self.epoch_metrics, "epoch metrics"),
        ] {
            comm.broadcast(buf, 0)
                .with_context(|| format!("receiving rank 0's {what}"))?;
            values += buf.len();
        }
        Ok((values * size_of::<f32>()) as u64)
    }

    fn start(self, rank: usize) -> Start {
        let world_size = self.epoch_metrics.len() / 2;
        let n = self.params.len();
        let hook = self.hook.map(|h| HookStart {
            // Saved by another number of ranks, no rank's error feedback is
            // this rank's: it starts again from zeros, the `Q`s (the same
            // on every rank) kept.
            error: match h.errors.len() == world_size * n {
                true => h.errors[rank * n..(rank + 1) * n].to_vec(),
                false => Vec::new(),
            },
            q: h.q,
        });
        Start {
            hook,
            epoch_loss_sum: self.epoch_metrics[rank],
            epoch_correct: self.epoch_metrics[world_size + rank],
            params: self.params,
            exp_avg: self.exp_avg,
            exp_avg_sq: self.exp_avg_sq,
            optimizer_step: self.optimizer_step,
            position: self.position,
            epoch_train_seconds: self.epoch_train_seconds,
            epoch_visited: self.visited,
            broadcast_bytes: 0,
        }
    }
}

/// Every rank's running loss sums, then correct counts, for a job of
/// `world_size` ranks resuming `state`: zero at an epoch boundary; the
/// checkpoint's own on as many ranks; on another number (an epoch begun in
/// another layout) their totals on rank 0 and zero elsewhere, as the
/// epoch's numbers add up every rank's.
fn epoch_metrics(state: &TrainingState, world_size: usize) -> anyhow::Result<Vec<f32>> {
    let (loss, correct) = (&state.epoch_loss_sum, &state.epoch_correct);
    if loss.len() != correct.len() {
        bail!(
            "the checkpoint holds loss sums of {} ranks but correct counts of {}",
            loss.len(),
            correct.len()
        );
    }
    let mut metrics = vec![0.0; 2 * world_size];
    if state.position.step == 0 {
        return Ok(metrics);
    }
    if loss.len() == world_size {
        return Ok([loss.as_slice(), correct].concat());
    }
    metrics[0] = loss.iter().sum();
    metrics[world_size] = correct.iter().sum();
    Ok(metrics)
}

/// PowerSGD's state as it travels: `name cols rank` lines as one byte per
/// f32 (exact), the `Q`s end to end, every rank's error.
struct HookParts {
    names: Vec<f32>,
    q: Vec<f32>,
    errors: Vec<f32>,
}

impl HookParts {
    fn of(state: HookState) -> Self {
        let text: String = (state.q.iter())
            .map(|(name, [cols, rank], _)| format!("{name} {cols} {rank}\n"))
            .collect();
        HookParts {
            names: text.bytes().map(f32::from).collect(),
            q: state.q.into_iter().flat_map(|(_, _, q)| q).collect(),
            errors: state.errors,
        }
    }

    fn lens(&self) -> [u64; 3] {
        [self.names.len(), self.q.len(), self.errors.len()].map(|n| n as u64)
    }

    fn sized([names, q, errors]: [u64; 3]) -> Self {
        let zeros = |n: u64| vec![0.0; n as usize];
        HookParts {
            names: zeros(names),
            q: zeros(q),
            errors: zeros(errors),
        }
    }

    fn state(self) -> anyhow::Result<HookState> {
        let garbled = || anyhow!("rank 0's PowerSGD state arrived garbled");
        let bytes: Vec<u8> = (self.names.iter())
            .map(|&x| (x.fract() == 0.0 && (0.0..256.0).contains(&x)).then_some(x as u8))
            .collect::<Option<_>>()
            .ok_or_else(garbled)?;
        let text = String::from_utf8(bytes).map_err(|_| garbled())?;
        let mut q = Vec::new();
        let mut at = 0;
        for line in text.lines() {
            let mut words = line.split(' ');
            let (Some(name), Some(cols), Some(rank), None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(garbled());
            };
            let (cols, rank): (usize, usize) = (
                cols.parse().map_err(|_| garbled())?,
                rank.parse().map_err(|_| garbled())?,
            );
            let values = self.q.get(at..at + cols * rank).ok_or_else(garbled)?;
            q.push((name.to_string(), [cols, rank], values.to_vec()));
            at += cols * rank;
        }
        Ok(HookState {
            q,
            errors: self.errors,
        })
    }
}

/// Each integer as four 16-bit pieces, which f32 holds exactly, so that the
/// f32 broadcast carries them bit for bit.
fn encode(values: &[u64]) -> Vec<f32> {
    values
        .iter()
        .flat_map(|v| (0..4).map(move |i| ((v >> (16 * i)) & 0xffff) as f32))
        .collect()
}

fn decode<const N: usize>(buf: &[f32]) -> anyhow::Result<[u64; N]> {
    let garbled = || anyhow!("rank 0's starting point arrived garbled");
    if buf.len() != 4 * N {
        return Err(garbled());
    }
    let mut values = [0u64; N];
    for (value, pieces) in values.iter_mut().zip(buf.chunks_exact(4)) {
        for (i, &x) in pieces.iter().enumerate() {
            if x.fract() != 0.0 || !(0.0..65536.0).contains(&x) {
                return Err(garbled());
            }
            *value |= (x as u64) << (16 * i);
        }
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powersgd_state_survives_the_f32_encoding_bit_for_bit() {
        let state = HookState {
            q: vec![
                (
                    "fc1.weight".into(),
                    [3, 2],
                    vec![0.5, -1.0, f32::MIN_POSITIVE, 2.0, 3.0, 4.0],
                ),
                ("conv2.weight".into(), [1, 1], vec![-0.0]),
            ],
            errors: vec![1.0, 2.0, 3.0, 4.0],
        };
        let parts = HookParts::of(state.clone());
        let sized = HookParts::sized(parts.lens());
        assert_eq!(sized.q.len(), 7);
        let back = parts.state().unwrap();
        assert_eq!(back, state);
        assert_eq!(back.q[1].2[0].to_bits(), (-0.0f32).to_bits());
    }

    /// Each rank continues its own error feedback; a checkpoint of another
    /// number of ranks holds no rank's of this run: zeros, the `Q`s kept.
    #[test]
    fn each_rank_takes_its_own_error_unless_the_world_changed() {
        let shared = |world: usize| Shared {
            position: Position::START,
            optimizer_step: 3,
            visited: (0, 1),
            params: vec![0.0; 2],
            exp_avg: vec![0.0; 2],
            exp_avg_sq: vec![0.0; 2],
            epoch_metrics: vec![0.0; 2 * world],
            epoch_train_seconds: 0.0,
            hook: Some(HookState {
                q: vec![("fc1.weight".into(), [1, 1], vec![0.5])],
                errors: vec![1.0, 2.0, 3.0, 4.0],
            }),
        };
        let hook = |world, rank| shared(world).start(rank).hook.unwrap();
        assert_eq!(hook(2, 1).error, [3.0, 4.0]);
        assert_eq!(hook(2, 0).error, [1.0, 2.0]);
        for rank in 0..4 {
            let resumed = hook(4, rank);
            assert!(resumed.error.is_empty(), "rank {rank}: {:?}", resumed.error);
            assert_eq!(resumed.q[0].2, [0.5]);
        }
    }

    /// The heal's byte count is what the broadcast carried: the header's
    /// eight integers (four f32 each), parameters and both moments, and
    /// every rank's two epoch numbers; the same on every rank.
    #[test]
    fn the_start_reports_the_bytes_its_broadcast_carried() {
        let weights = vec![0.25; 5];
        let comms = comm::LocalCommunicator::job(2, std::time::Duration::from_secs(10));
        let counted: Vec<u64> = std::thread::scope(|s| {
            let ranks: Vec<_> = (comms.into_iter().enumerate())
                .map(|(rank, c)| {
                    let origin = match rank {
                        0 => Origin::Weights(weights.clone()),
                        _ => Origin::Fresh,
                    };
                    s.spawn(move || {
                        let mut comm = CommThread::spawn(Box::new(c)).unwrap();
                        let start = agree(origin, Some(&mut comm), || vec![0.0; 5], 5).unwrap();
                        assert_eq!(start.params, [0.25; 5], "rank {rank}");
                        start.broadcast_bytes
                    })
                })
                .collect();
            ranks.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(counted, [4 * (8 * 4 + 3 * 5 + 2 * 2); 2]);
        let alone = agree(Origin::Fresh, None, || vec![0.0; 5], 5).unwrap();
        assert_eq!(alone.broadcast_bytes, 0);
    }

    #[test]
    fn integers_survive_the_f32_encoding_bit_for_bit() {
        let values = [0, 1, 65_535, 65_536, u64::from(u32::MAX) + 7, u64::MAX];
        assert_eq!(decode::<6>(&encode(&values)).unwrap(), values);
        assert!(decode::<1>(&[0.5, 0.0, 0.0, 0.0]).is_err());
        assert!(decode::<2>(&encode(&[1])).is_err());
    }
}
