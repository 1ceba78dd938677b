//! `mpirun -np 2 trainer ...` is a job of two ranks, the same as
//! `--world-size 2`: rank, size and the rendezvous come from Open MPI's
//! variables. Skipped (saying so) where mpirun is absent, unless
//! REQUIRE_MPI=1 (CI installs Debian's openmpi-bin).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use comm::launch_var;
use common::{data_arg, dataset, final_state, stderr, trainer};

const TRAINING: [&str; 8] = [
    "--epochs",
    "1",
    "--max-steps",
    "4",
    "--threads",
    "1",
    "--seed",
    "3",
];

fn mpirun_present() -> bool {
    let found = Command::new("mpirun").arg("--version").output().is_ok();
    if !found {
        assert!(
            std::env::var("REQUIRE_MPI").as_deref() != Ok("1"),
            "REQUIRE_MPI=1 but mpirun is not on PATH (apt-get install openmpi-bin)"
        );
        eprintln!("skipped: mpirun is not on PATH (apt-get install openmpi-bin)");
    }
    found
}

fn mpirun_job(dir: &Path) -> Output {
    let exe = trainer().get_program().to_owned();
    let mut cmd = Command::new("mpirun");
    for var in launch_var::TORCHRUN {
        cmd.env_remove(var);
    }
    cmd.args(["--allow-run-as-root", "--oversubscribe", "-np", "2"])
        .arg(exe)
        .args(TRAINING)
        .arg("--checkpoint-dir")
        .arg(dir)
        .args(data_arg(dataset()));
    cmd.output().expect("running mpirun")
}

#[test]
fn mpirun_of_two_ranks_trains_what_world_size_two_trains() {
    if !mpirun_present() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (local, mpi) = (tmp.path().join("local"), tmp.path().join("mpi"));
    let out = trainer()
        .args(["--world-size", "2"])
        .args(TRAINING)
        .arg("--checkpoint-dir")
        .arg(&local)
        .args(data_arg(dataset()))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = mpirun_job(&mpi);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("rank 1/2 joined") && err.contains("via mpirun"),
        "{err}"
    );
    let (want, got) = (final_state(&local), final_state(&mpi));
    let bits = |t: &[f32]| t.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(
        bits(&want.params) == bits(&got.params),
        "the weights differ"
    );
}
