//! Whether a batch's buffers fit, decided before they are made. Their
//! size is measured: the schedule makes its buffers for the smallest batch
//! it can and for twice that on this very backend, and the backend's count
//! of the bytes it handed out says what a sample costs and what does not
//! grow with the batch ([`BatchCost`]). That is compared with what this
//! rank may still take ([`Room`]): on the host the machine's available
//! memory and its memory cgroup's headroom, shared by the machine's ranks,
//! and the process's address-space limit; on a GPU its free memory. A
//! batch that does not fit is refused with the figures and the largest
//! batch that does; an allocation the device refuses all the same ends in
//! an error naming the buffers and the fix.

use anyhow::{Context, bail};
use core_tensor::Backend;
use launcher::contract::Misconfigured;

use crate::monitor::procfs;

/// Test batches: their size only changes memory use.
pub const EVAL_BATCH: usize = 256;

/// An epoch's training batches on this rank, as the loop runs them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochBatches {
    /// Samples per step asked for (`--batch-size`).
    pub batch: usize,
    /// This rank's samples in the epoch.
    pub samples: usize,
    /// `--max-steps`: the steps the epoch is cut to.
    pub max_steps: Option<usize>,
    /// The ranks sharing this machine's memory.
    pub local_ranks: usize,
    /// The test shards this rank evaluates at the epoch's end (their
    /// samples each): their buffers are made then, and kept.
    pub test_shards: Vec<usize>,
}

impl EpochBatches {
    /// The sizes of an epoch's batches of at most `batch`, each once: the
    /// full one, and the last one where it is smaller and reached.
    fn sizes_with(&self, batch: usize) -> Vec<usize> {
        let steps = self.samples.div_ceil(batch);
        let last = self.samples - (steps.max(1) - 1) * batch;
        let mut sizes = vec![batch.min(self.samples)];
        if steps > 1 && last != batch && self.max_steps.is_none_or(|m| m >= steps) {
            sizes.push(last);
        }
        sizes
    }

    /// The sizes of the test batches (of at most [`EVAL_BATCH`]) of the
    /// test shards, each once.
    fn test_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = (self.test_shards.iter())
            .filter(|&&s| s > 0)
            .flat_map(|&s| [EVAL_BATCH.min(s), s % EVAL_BATCH])
            .filter(|&n| n > 0)
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        sizes
    }
}

/// What a schedule's buffers take on a device for a batch of `n`:
/// `fixed + per_sample * n` bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BatchCost {
    fixed: u64,
    per_sample: u64,
}

impl BatchCost {
    /// Measures what `make` allocates on `b` for batches of `unit` and
    /// `2 * unit` samples (`unit`: the smallest batch the schedule runs,
    /// a pipeline's micro-batches), freeing them again.
    pub(crate) fn measure<B: Backend, T>(
        b: &B,
        unit: usize,
        make: impl Fn(usize) -> core_tensor::Result<T>,
    ) -> core_tensor::Result<Self> {
        let mut made = [0u64; 2];
        for (bytes, n) in made.iter_mut().zip([unit, 2 * unit]) {
            let before = b.allocated_bytes();
            drop(make(n)?);
            *bytes = b.allocated_bytes() - before;
        }
        let per_unit = made[1].saturating_sub(made[0]);
        Ok(Self {
            fixed: made[0].saturating_sub(per_unit),
            per_sample: per_unit / unit as u64,
        })
    }

    pub(crate) fn bytes(&self, n: usize) -> u64 {
        self.fixed + self.per_sample * n as u64
    }

    fn bytes_of(&self, sizes: &[usize]) -> u64 {
        sizes.iter().map(|&n| self.bytes(n)).sum()
    }
}

/// What this rank may still allocate on its device, and what says so.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Room {
    pub bytes: u64,
    /// For the message, e.g. "the memory cgroup's limit of 8.0 GiB leaves
    /// this rank 2.1 GiB".
    pub why: String,
}

impl Room {
    /// `b`'s room now: a GPU's free memory, or the host's for one of
    /// `local_ranks` ranks sharing it; `None` where nothing says.
    pub(crate) fn now<B: Backend>(b: &B, local_ranks: usize) -> anyhow::Result<Option<Self>> {
        if let Some((device, free)) = b.free_device_memory()? {
            return Ok(Some(Self {
                bytes: free,
                why: format!("{device} has {} free", amount(free)),
            }));
        }
        let share = |bytes: u64| bytes / local_ranks.max(1) as u64;
        let ranks = match local_ranks {
            1 => String::new(),
            n => format!(", shared by this machine's {n} ranks"),
        };
        let machine = procfs::available_bytes().map(|free| Self {
            bytes: share(free),
            why: format!("this machine has {} available{ranks}", amount(free)),
        });
        let cgroup = procfs::cgroup_room_bytes().map(|(room, limit)| Self {
            bytes: share(room),
            why: format!(
                "the memory cgroup's limit of {} leaves {}{ranks}",
                amount(limit),
                amount(room)
            ),
        });
        // The limit is the process's own; a worker process holds one rank.
        let address_space = procfs::address_space_limit_bytes().map(|limit| {
            let used = procfs::virtual_bytes().unwrap_or(0);
            Self {
                bytes: limit.saturating_sub(used),
                why: format!(
                    "the address-space limit (ulimit -v) of {} leaves {}",
                    amount(limit),
                    amount(limit.saturating_sub(used))
                ),
            }
        });
        Ok([machine, cgroup, address_space]
            .into_iter()
            .flatten()
            .min_by_key(|room| room.bytes))
    }
}

/// The largest batch whose epoch's buffers (`epoch.sizes_with`) take at
/// most `room` bytes at `cost`; `None` when not even one sample fits.
fn largest_fitting(
    cost: &BatchCost,
    epoch: &EpochBatches,
    room: u64,
    unit: usize,
) -> Option<usize> {
    let most = room.checked_sub(cost.fixed)? / cost.per_sample.max(1);
    let top = (most as usize).min(epoch.batch).min(epoch.samples.max(1));
    // The last batch's buffers come on top of the full one's: the
    // largest full batch may leave a last one that no longer fits.
    (unit..=top)
        .rev()
        .find(|&b| cost.bytes_of(&epoch.sizes_with(b)) <= room)
}

/// What the test batches of `epoch` that `made` has no buffers for will
/// take, `make_test` making a test batch's buffers.
pub(crate) fn test_reserve<B: Backend, T>(
    b: &B,
    epoch: &EpochBatches,
    made: impl Fn(usize) -> bool,
    make_test: impl Fn(usize) -> core_tensor::Result<T>,
) -> anyhow::Result<u64> {
    let sizes: Vec<usize> = (epoch.test_sizes().into_iter())
        .filter(|&n| !made(n))
        .collect();
    if sizes.is_empty() {
        return Ok(0);
    }
    let cost = BatchCost::measure(b, 1, make_test).context("sizing the test batches' buffers")?;
    Ok(cost.bytes_of(&sizes))
}

/// Makes the training buffers of `sizes` (new batch sizes of `epoch`)
/// with `make`, once their cost, measured on batches of `unit` and
/// `2 * unit`, and `reserve` (the test batches' buffers, made later) are
/// known to fit in what this rank may still take.
pub(crate) fn training_buffers<B: Backend, T>(
    b: &B,
    (sizes, epoch): (&[usize], &EpochBatches),
    (unit, reserve): (usize, u64),
    make: impl Fn(usize) -> core_tensor::Result<T>,
) -> anyhow::Result<Vec<T>> {
    let cost = BatchCost::measure(b, unit, &make).context("sizing the batch's buffers")?;
    // What kernels take for themselves while they run comes on top.
    let reserve = reserve + b.transient_bytes();
    let need = cost.bytes_of(sizes) + reserve;
    let what = format!("a training batch of {}", epoch.batch.min(epoch.samples));
    if let Some(room) = Room::now(b, epoch.local_ranks)?
        && need > room.bytes
    {
        let left = room.bytes.saturating_sub(reserve);
        let fix = match largest_fitting(&cost, epoch, left, unit) {
            Some(n) => {
                format!("the largest batch that fits is {n}: lower --batch-size to {n} or less")
            }
            None => {
                "not even the smallest batch fits: free memory, or run fewer ranks on this machine"
                    .into()
            }
        };
        let besides = match reserve {
            0 => String::new(),
            r => format!(
                ", and {} for the test batches and kernel scratch",
                amount(r)
            ),
        };
        // The job's flags against this machine: a restart would meet it
        // again (exit 78, which the launcher does not restart on).
        bail!(Misconfigured(format!(
            "{what} needs {} ({} KiB a sample{besides}), but {}: {fix}",
            amount(need),
            cost.per_sample.div_ceil(1024),
            room.why
        )));
    }
    let fix = "lower --batch-size";
    made(sizes, make, || {
        format!("making the buffers of {what}: {fix}")
    })
}

/// Makes the test buffers of a batch of `n` with `make`: their room was
/// kept when the epoch's training buffers were made ([`test_reserve`]),
/// and what the process's other work took since (the allocator's arenas
/// count against an address-space limit) is no reason to refuse them
/// before the device does.
pub(crate) fn test_buffers<T>(
    n: usize,
    make: impl Fn(usize) -> core_tensor::Result<T>,
) -> anyhow::Result<T> {
    let fix = "run fewer ranks on this machine, or free memory";
    make(n).with_context(|| format!("making the buffers of a test batch of {n}: {fix}"))
}

/// `make` for each of `sizes`; a failure (the device's refusal) in
/// `context`.
fn made<T>(
    sizes: &[usize],
    make: impl Fn(usize) -> core_tensor::Result<T>,
    context: impl Fn() -> String,
) -> anyhow::Result<Vec<T>> {
    sizes
        .iter()
        .map(|&n| make(n).with_context(&context))
        .collect()
}

/// The most memory this process can hold, in bytes: what it holds already
/// plus what the machine (and its memory cgroup) can still give, and no
/// more than its address-space limit (`ulimit -v`, past which an
/// allocation fails); `None` where the machine does not say.
pub(crate) fn host_room_bytes() -> Option<u64> {
    let free = match (procfs::available_bytes(), procfs::cgroup_room_bytes()) {
        (Some(free), Some((cgroup, _))) => free.min(cgroup),
        (free, cgroup) => free.or(cgroup.map(|(room, _)| room))?,
    };
    let room = free + (procfs::resident_mib()? * 1024.0 * 1024.0) as u64;
    Some(procfs::address_space_limit_bytes().map_or(room, |limit| room.min(limit)))
}

/// `7.1 GiB`, or `85 MiB` below a GiB.
fn amount(bytes: u64) -> String {
    match bytes {
        0..GIB => format!("{} MiB", bytes.div_ceil(1 << 20)),
        _ => format!("{:.1} GiB", bytes as f64 / GIB as f64),
    }
}

const GIB: u64 = 1 << 30;

#[cfg(test)]
mod tests;
