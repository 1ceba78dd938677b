//! A batch too large for the memory a rank has: refused before its buffers
//! are made (exit 78, the job's configuration), with the figures and the
//! largest batch that fits (which then trains, and one more sample is
//! refused), never an abort with a stack trace. On the CPU under a real
//! address-space limit (util-linux's `prlimit --as`) and in a memory
//! cgroup of its own (where this process may make one: root, a writable
//! cgroup hierarchy), on cuda-emu's GPU of `CUDA_EMU_MEMORY_MIB`.

mod common;

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Output};

use common::{data_arg, dataset, stderr, trainer};
use core_tensor::{Backend, Cuda};
use trainer::model::DropoutRates;
use trainer::monitor::procfs::MemoryCgroup;
use trainer::train::{Silent, TrainConfig, Trainer};

/// The address space each trainer gets: its buffers' share is about 1.2 GiB.
const ADDRESS_SPACE: &str = "--as=1500000000";

/// `cmd` under `prlimit` with `limit`.
fn limited(limit: &str, cmd: &Command) -> Command {
    let mut prlimit = Command::new("prlimit");
    prlimit
        .arg(limit)
        .arg(cmd.get_program())
        .args(cmd.get_args());
    for (var, value) in cmd.get_envs() {
        match value {
            Some(value) => prlimit.env(var, value),
            None => prlimit.env_remove(var),
        };
    }
    prlimit
}

/// One CNN step of `batch` on `device`, with `extra`.
fn one_step(device: &str, batch: usize) -> Command {
    let mut cmd = trainer();
    cmd.args(["--device", device, "--threads", "1", "--epochs", "1"])
        .args(["--max-steps", "1", "--batch-size", &batch.to_string()])
        .args(data_arg(dataset()));
    cmd
}

fn output(mut cmd: Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?} (prlimit: util-linux): {e}"))
}

/// The refusal's one line, which names `room` and the largest batch that
/// fits; that batch.
fn refused(out: &Output, room: &str) -> usize {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(78), "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error: ")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        !err.contains("memory allocation of") && !err.contains("backtrace"),
        "{err}"
    );
    let line = errors[0];
    assert!(
        line.contains("a training batch of ") && line.contains(room),
        "{line}"
    );
    let (_, largest) = line
        .split_once("the largest batch that fits is ")
        .unwrap_or_else(|| panic!("no largest batch in {line}"));
    let n: usize = largest.split(':').next().unwrap().parse().unwrap();
    assert!(
        line.ends_with(&format!("lower --batch-size to {n} or less")),
        "{line}"
    );
    n
}

#[test]
fn a_batch_past_the_address_space_limit_is_refused_with_the_largest_that_fits() {
    let room = "the address-space limit (ulimit -v) of 1.4 GiB leaves";
    let largest = refused(
        &output(limited(ADDRESS_SPACE, &one_step("cpu", 60_000))),
        room,
    );
    // About 1.2 GiB of 534 KiB samples, the test batches' buffers besides.
    assert!((1000..2400).contains(&largest), "{largest}");
    // A hair above the figure is refused with about the same figure, a hair
    // below trains: what the process had mapped when it checked (its
    // threads, the allocator's arenas) moves it by a sample or two.
    let hair = largest / 100;
    let above = output(limited(ADDRESS_SPACE, &one_step("cpu", largest + hair)));
    let again = refused(&above, room);
    assert!(again.abs_diff(largest) <= hair, "{again} after {largest}");
    let fits = output(limited(ADDRESS_SPACE, &one_step("cpu", largest - hair)));
    assert!(fits.status.success(), "{}", stderr(&fits));
}

/// A memory cgroup of its own, under this process's, limited to `bytes`;
/// removed when dropped (its process gone).
struct LimitedCgroup(PathBuf);

/// The exit code of the wrapper when it may not join the cgroup.
const NOT_JOINED: i32 = 111;

impl LimitedCgroup {
    /// `Err(why)` where this process may not make one.
    fn new(bytes: u64) -> Result<Self, String> {
        let own = MemoryCgroup::of_this_process().ok_or("no memory cgroup")?;
        let name = format!("memory-limits-test-{}", std::process::id());
        let dir = own.dir.join(name);
        fs::create_dir(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        let cgroup = Self(dir);
        let limit = cgroup.0.join(own.limit_file);
        fs::write(&limit, bytes.to_string())
            .map_err(|e| format!("writing {}: {e}", limit.display()))?;
        Ok(cgroup)
    }

    /// `cmd`, run by a shell that moves itself into this cgroup first.
    fn running(&self, cmd: &Command) -> Command {
        let procs = self.0.join("cgroup.procs");
        let mut sh = Command::new("sh");
        sh.args([
            "-c",
            &format!("echo $$ > \"$0\" || exit {NOT_JOINED}; exec \"$@\""),
        ])
        .arg(procs)
        .arg(cmd.get_program())
        .args(cmd.get_args());
        sh
    }
}

impl Drop for LimitedCgroup {
    fn drop(&mut self) {
        let _ = fs::remove_dir(&self.0);
    }
}

/// One step of `batch` in a cgroup of 1 GiB, or `None` (and why) where
/// this process may not make one.
fn in_a_cgroup(batch: usize) -> Option<Output> {
    let cgroup = match LimitedCgroup::new(1 << 30) {
        Ok(cgroup) => cgroup,
        Err(why) => {
            eprintln!("skipped: no memory cgroup of its own for the trainer ({why})");
            return None;
        }
    };
    let out = output(cgroup.running(&one_step("cpu", batch)));
    if out.status.code() == Some(NOT_JOINED) {
        eprintln!("skipped: the trainer may not join a memory cgroup of its own");
        return None;
    }
    Some(out)
}

#[test]
fn a_batch_past_the_memory_cgroups_limit_is_refused_with_the_largest_that_fits() {
    let Some(refusal) = in_a_cgroup(60_000) else {
        return;
    };
    let largest = refused(&refusal, "the memory cgroup's limit of 1.0 GiB leaves");
    // Under 1 GiB of 534 KiB samples, the data set and test batches besides.
    assert!((800..2000).contains(&largest), "{largest}");
    // It trains, its pages written, within the limit: no OOM kill. A hair
    // below the figure: the cgroup's own usage when the next run checks
    // (what the kernel charged it for meanwhile) moves it by a sample or
    // two.
    let fits = in_a_cgroup(largest - largest / 100).unwrap();
    assert!(
        fits.status.success(),
        "{:?}: {}",
        fits.status,
        stderr(&fits)
    );
}

const EMULATED: [&str; 2] = [
    "emulated_gpu_refuses_a_batch_past_its_memory",
    "emulated_gpu_trains_the_largest_batch_that_fits",
];

/// The GPU's memory in the emulator's re-run.
const GPU_MIB: &str = "160";

#[test]
fn batches_on_the_cuda_emulator() {
    cuda_emu::rerun_on_emulator(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &[&["--exact", "--test-threads=1"][..], &EMULATED].concat(),
        &[("CUDA_EMU_DEVICES", "1"), ("CUDA_EMU_MEMORY_MIB", GPU_MIB)],
        EMULATED.len(),
    );
}

/// The trainer binary on the emulated GPU: its data set and model take
/// about 70 MiB of the 160, a batch of 60,000 far more.
#[test]
fn emulated_gpu_refuses_a_batch_past_its_memory() {
    let Some(gpu) = common::emulated_gpu(0) else {
        return;
    };
    let room = format!("but {} has ", gpu.device_name());
    let largest = refused(&output(one_step("cuda", 60_000)), &room);
    assert!((1..200).contains(&largest), "{largest}");
    assert_eq!(
        refused(&output(one_step("cuda", largest + 1)), &room),
        largest
    );
    // An allocation past the GPU's memory is an error naming the GPU.
    let err = gpu.zeros::<f32>(1 << 30).unwrap_err();
    assert!(
        err.to_string().starts_with(&format!(
            "out of memory: {} could not give 4.00 GiB",
            gpu.device_name()
        )),
        "{err}"
    );
}

/// In this process, with another holder leaving 48 MiB of the GPU free:
/// the batch the refusal names trains.
#[test]
fn emulated_gpu_trains_the_largest_batch_that_fits() {
    let Some(gpu) = common::emulated_gpu(0) else {
        return;
    };
    let data = common::small_data(512, 16);
    let free = |gpu: &Cuda| gpu.memory().unwrap().0;
    let _other = gpu.zeros::<u8>((free(&gpu) - (48 << 20)) as usize).unwrap();
    let cfg = |batch_size| TrainConfig {
        epochs: 1,
        batch_size,
        max_steps: Some(1),
        dropout: DropoutRates::OFF,
        ..common::pipeline::config()
    };
    let train = |batch| {
        let mut trainer = Trainer::new(gpu.clone(), &data, cfg(batch), None).unwrap();
        trainer.train_epoch(1, &mut Silent, &mut |_| Ok(()))
    };
    let err = format!("{:#}", train(512).unwrap_err());
    let (_, largest) = err
        .split_once("the largest batch that fits is ")
        .expect(&err);
    let largest: usize = largest.split(':').next().unwrap().parse().unwrap();
    assert!((1..90).contains(&largest), "{err}");
    train(largest).unwrap();
    let one_more = format!("{:#}", train(largest + 1).unwrap_err());
    assert!(one_more.contains(&format!("is {largest}:")), "{one_more}");
}
