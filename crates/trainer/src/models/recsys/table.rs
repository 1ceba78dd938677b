//! The embedding table's size, known from the index pass (ids index its
//! rows directly), checked against the machine's memory and a GPU's before
//! anything that size is made: one id of 16,777,215 in a small file asks
//! for gigabytes, and the starting state's buffers, allocated before the
//! trainer's own memory check, aborted the process when they did not fit.

use anyhow::bail;

use super::HIDDEN;
use super::ratings::RatingsIndex;
use crate::models::{Footprint, GpuRoom};

// Model-sized f32 buffers, by where they live and how long. Counted as
// allocated, which an address-space limit (`ulimit -v`) counts: a fresh
// start's zeroed moments take no memory until written, so a lone CPU rank
// peaked at 4 copies resident where 7 are counted (1 GiB for a 264 MB
// model); saving a checkpoint peaked at the 12 counted, resuming at the 7.

/// Every rank's starting state (`checkpoint::origin::Start`: parameters and
/// Adam's two moments), in host memory until `Trainer::with_model` returns.
const START: u64 = 3;
/// Every rank's replica (`train::replica::Replica`: parameters, gradients,
/// Adam's two moments) on its device, host memory for the CPU, all along.
pub const REPLICA: u64 = 4;
/// Gradients averaged through host memory (more than one rank, not over
/// NCCL): `ddp::HostHook`'s staging buffers (page-locked on a GPU), or
/// `SparseExchange`'s copy of the tables and the dense rest's staging.
const EXCHANGE: u64 = 1;
/// Rank 0 saving a checkpoint (`Trainer::save_checkpoint`): the three
/// vectors copied to the host, and, while `optimizer.safetensors` is
/// encoded (`checkpoint::files::encode`), `model.safetensors`' bytes (1)
/// and the moments' bytes and their file (2 each; the header is sorted in
/// place, once the bytes are dropped).
const SAVE: u64 = 8;
/// Rank 0 reading a checkpoint to resume (`checkpoint::state::load`),
/// before its starting state: both files' bytes (3), the three vectors, and
/// the pieces of the one being joined.
const LOAD: u64 = 7;

impl Footprint {
    /// The most model-sized buffers this machine's memory holds at once,
    /// its ranks together: while they start (their starting states, rank
    /// 0 reading a checkpoint in place of its own), once they have made
    /// their replicas (the starting states still held), or while they
    /// train (rank 0 saving a checkpoint).
    pub fn host_copies(&self) -> u64 {
        let ranks = self.local_ranks as u64;
        let replica = if self.gpu { 0 } else { REPLICA };
        let training = replica + if self.host_exchange { EXCHANGE } else { 0 };
        let starting = ranks * START + if self.loads { LOAD - START } else { 0 };
        let started = ranks * (START + training);
        let saving = ranks * training + if self.saves { SAVE } else { 0 };
        starting.max(started).max(saving)
    }

    /// For the message: where training holds how many copies.
    fn describe(&self) -> String {
        let device = if self.gpu { "on GPUs" } else { "on the CPU" };
        let ranks = match self.local_ranks {
            1 => String::new(),
            n => format!(", its {n} ranks together"),
        };
        let saves = if self.saves {
            ", rank 0's checkpoints included"
        } else {
            ""
        };
        let copies = self.host_copies();
        format!(
            "training {device} holds up to {copies} copies of them in this machine's memory{ranks}{saves}"
        )
    }
}

/// Parameters of the model for `index`'s ids with rows of `dim`: the
/// table (a row and a bias per user and per movie) and the MLP.
pub fn parameter_count(index: &RatingsIndex, dim: usize) -> u64 {
    let rows = u64::from(index.users) + u64::from(index.items);
    let d = dim as u64;
    let hidden = HIDDEN as u64;
    rows * (d + 1) + hidden * 2 * d + hidden + hidden + 1
}

/// Refuses `index`'s ids when the buffers `footprint` says this machine
/// holds need more than `room` bytes (its memory for this process; `None`:
/// unknown, not checked).
pub fn check_fits(
    index: &RatingsIndex,
    dim: usize,
    footprint: &Footprint,
    room: Option<u64>,
) -> anyhow::Result<()> {
    let Some(room) = room else {
        return Ok(());
    };
    let bytes = 4 * parameter_count(index, dim);
    let copies = footprint.host_copies();
    let need = bytes.saturating_mul(copies);
    if need <= room {
        return Ok(());
    }
    bail!(
        "{}; {}, {:.1} GiB, but this machine has {:.1} GiB: ids index the table's rows directly, so they must be dense (MovieLens' are small): renumber them 1, 2, 3, ...",
        table_size(index, dim),
        footprint.describe(),
        gib(need),
        gib(room)
    )
}

/// Refuses `index`'s ids when the replicas of the ranks training on `gpu`
/// do not fit in it: this rank's in what is free now, all of theirs in the
/// whole GPU (the others may have made theirs already).
pub fn check_gpu_fits(index: &RatingsIndex, dim: usize, gpu: &GpuRoom) -> anyhow::Result<()> {
    let bytes = 4 * parameter_count(index, dim);
    let mine = bytes.saturating_mul(REPLICA);
    let all = mine.saturating_mul(gpu.ranks as u64);
    let (need, has) = if all > gpu.total {
        (all, format!("{:.1} GiB in all", gib(gpu.total)))
    } else if mine > gpu.free {
        let (free, total) = (gib(gpu.free), gib(gpu.total));
        (mine, format!("{free:.1} GiB free of {total:.1} GiB"))
    } else {
        return Ok(());
    };
    let (ranks, or_more_gpus) = match gpu.ranks {
        1 => (String::new(), ""),
        n => (
            format!(" for each of the {n} ranks training on it"),
            ", give each rank a GPU of its own",
        ),
    };
    bail!(
        "{}; training keeps {REPLICA} copies of them on the GPU (weights, gradients, Adam's two moments){ranks}, {:.1} GiB, but {} has {has}: where the ids are sparse, renumber them 1, 2, 3, ... (they index the table's rows directly); else lower --embedding-dim{or_more_gpus}, or train on the CPU (--device cpu)",
        table_size(index, dim),
        gib(need),
        gpu.name
    )
}

/// The messages' start: the file, its largest id, the table's size.
fn table_size(index: &RatingsIndex, dim: usize) -> String {
    let [user, movie] = index.largest;
    let (what, id) = if user.id >= movie.id {
        ("userId", user)
    } else {
        ("movieId", movie)
    };
    format!(
        "--ratings {}: the largest id, {what} {} on line {}, makes the embedding table {} rows of {dim} (a row per id up to the largest user's and movie's): {:.1} GiB of parameters",
        index.path.display(),
        id.id,
        id.line,
        u64::from(index.users) + u64::from(index.items),
        gib(4 * parameter_count(index, dim))
    )
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ids up to movieId 2,000,000 (on line 3): 2,000,007 rows of 33
    /// floats and the MLP, about 264 MB; and the model's bytes.
    fn sparse_ids() -> (RatingsIndex, u64, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        let mut text = String::from("userId,movieId,rating,timestamp\n1,2,3.0,4\n");
        text += "5,2000000,3.0,4\n5,2000000,4.0,4\n3,1,2.0,4\n";
        std::fs::write(&path, text).unwrap();
        let index = RatingsIndex::build(&path).unwrap();
        assert_eq!(index.items, 2_000_001);
        let bytes = 4 * parameter_count(&index, 32);
        assert_eq!(bytes, 4 * (2_000_007 * 33 + 64 * 64 + 129));
        (index, bytes, dir)
    }

    const ALONE: Footprint = Footprint {
        gpu: false,
        local_ranks: 1,
        host_exchange: false,
        saves: false,
        loads: false,
    };

    /// The starting state everywhere; the replica on the CPU only; the
    /// exchange's staging per rank; rank 0's checkpoints once.
    #[test]
    fn host_copies_follow_the_device_and_rank_0s_checkpoints() {
        let gpu = Footprint { gpu: true, ..ALONE };
        assert_eq!((ALONE.host_copies(), gpu.host_copies()), (7, 3));
        let two = |gpu, host_exchange| Footprint {
            gpu,
            local_ranks: 2,
            host_exchange,
            ..ALONE
        };
        assert_eq!(two(false, true).host_copies(), 2 * (3 + 4 + 1));
        assert_eq!(two(true, true).host_copies(), 2 * (3 + 1));
        // NCCL: nothing of the training in host memory.
        assert_eq!(two(true, false).host_copies(), 2 * 3);
        let saves = Footprint {
            saves: true,
            ..ALONE
        };
        assert_eq!(saves.host_copies(), 4 + 8);
        assert_eq!(Footprint { gpu: true, ..saves }.host_copies(), 8);
        let loads = Footprint { loads: true, ..gpu };
        assert_eq!(loads.host_copies(), 7);
        assert_eq!(
            Footprint {
                loads: true,
                ..ALONE
            }
            .host_copies(),
            7
        );
    }

    /// One large id among small ones is refused, naming the id, its line,
    /// the sizes and the copies; the same table fits where the room is
    /// larger, or on a GPU, which holds the replica in its own memory.
    #[test]
    fn a_table_past_the_machine_is_refused_naming_the_largest_id() {
        let (index, bytes, _dir) = sparse_ids();
        check_fits(&index, 32, &ALONE, Some(7 * bytes)).unwrap();
        check_fits(&index, 32, &ALONE, None).unwrap();
        let gpu = Footprint { gpu: true, ..ALONE };
        check_fits(&index, 32, &gpu, Some(4 * bytes)).unwrap();
        let err = check_fits(&index, 32, &ALONE, Some(4 * bytes)).unwrap_err();
        assert!(err.to_string().contains("up to 7 copies"), "{err}");
        let two = Footprint {
            local_ranks: 2,
            host_exchange: true,
            ..ALONE
        };
        let err = check_fits(&index, 32, &two, Some(7 * bytes))
            .unwrap_err()
            .to_string();
        for needle in [
            "movieId 2000000 on line 3",
            "0.2 GiB of parameters",
            "training on the CPU holds up to 16 copies of them in this machine's memory, its 2 ranks together, 3.9 GiB",
            "this machine has 1.7 GiB",
            "must be dense",
        ] {
            assert!(err.contains(needle), "`{needle}` not in {err}");
        }
        let saving = Footprint { saves: true, ..gpu };
        let err = check_fits(&index, 32, &saving, Some(4 * bytes)).unwrap_err();
        assert!(
            err.to_string()
                .contains("training on GPUs holds up to 8 copies of them in this machine's memory, rank 0's checkpoints included"),
            "{err}"
        );
    }

    /// This rank's replica must fit in what is free, those of the ranks
    /// sharing the GPU in the whole of it.
    #[test]
    fn a_table_past_the_gpu_is_refused_naming_it() {
        let (index, bytes, _dir) = sparse_ids();
        let gpu = GpuRoom {
            name: "cuda:0 (cuda-emu)".into(),
            free: 4 * bytes,
            total: 8 * bytes,
            ranks: 1,
        };
        check_gpu_fits(&index, 32, &gpu).unwrap();
        check_gpu_fits(
            &index,
            32,
            &GpuRoom {
                ranks: 2,
                ..gpu.clone()
            },
        )
        .unwrap();
        let busy = GpuRoom {
            free: 2 * bytes,
            ..gpu.clone()
        };
        let err = check_gpu_fits(&index, 32, &busy).unwrap_err().to_string();
        for needle in [
            "movieId 2000000 on line 3",
            "training keeps 4 copies of them on the GPU (weights, gradients, Adam's two moments), 1.0 GiB",
            "but cuda:0 (cuda-emu) has 0.5 GiB free of 2.0 GiB",
            "lower --embedding-dim, or train on the CPU (--device cpu)",
        ] {
            assert!(err.contains(needle), "`{needle}` not in {err}");
        }
        let shared = GpuRoom { ranks: 3, ..gpu };
        let err = check_gpu_fits(&index, 32, &shared).unwrap_err().to_string();
        for needle in [
            "for each of the 3 ranks training on it, 3.0 GiB",
            "has 2.0 GiB in all",
            "give each rank a GPU of its own",
        ] {
            assert!(err.contains(needle), "`{needle}` not in {err}");
        }
    }
}
