//! Pipeline parallelism's GPU transport, run without a GPU on `cuda-emu`:
//! NCCL point-to-point (`ncclSend`/`ncclRecv` in one group) between two
//! emulated GPUs, on a communicator of its own made through the job's
//! store (a sub-group's, as a pipeline's stages use).
//!
//! `pipeline_on_the_cuda_emulator` builds the emulator and re-runs this
//! binary with it loaded; there the `emulated_*` tests do the work.

mod common;

use std::path::Path;
use std::time::Duration;

use comm::nccl::NcclCommunicator;
use comm::{CommConfig, TcpCommunicator};
use common::free_port;
use core_tensor::{Backend, Cuda};

/// A device buffer of the CUDA backend.
type Buf = <Cuda as Backend>::Storage<f32>;

const EMULATED: [&str; 1] = ["emulated_nccl_send_recv_between_two_gpus"];

#[test]
fn pipeline_on_the_cuda_emulator() {
    let mut args = vec!["--exact", "--test-threads=1"];
    args.extend(EMULATED);
    cuda_emu::rerun_on_emulator(
        Path::new(env!("CARGO_TARGET_TMPDIR")),
        &args,
        &[("CUDA_EMU_DEVICES", "2")],
        EMULATED.len(),
    );
}

/// The emulated GPU `ordinal`, in the re-run only.
fn emulated_gpu(ordinal: usize) -> Option<Cuda> {
    if !cuda_emu::in_emulator() {
        return None;
    }
    let gpu = Cuda::new(ordinal).expect("the emulator is loaded");
    assert!(gpu.describe().contains("cuda-emu"), "{}", gpu.describe());
    Some(gpu)
}

fn values(rank: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| (rank * 1_000_003 + i) as f32).collect()
}

/// Both directions at once (longer than the emulator's staging slot), then
/// one direction only, then a peer that is this rank itself (refused).
#[test]
fn emulated_nccl_send_recv_between_two_gpus() {
    const LEN: usize = 600_001;
    if emulated_gpu(0).is_none() {
        return;
    }
    let port = free_port();
    let got = common::on_two_ranks(|rank| {
        let gpu = emulated_gpu(rank).unwrap();
        let timeout = Duration::from_secs(60);
        let cfg = CommConfig::new(rank, 2, "127.0.0.1", port).with_timeout(timeout);
        let mut tcp = TcpCommunicator::connect(&cfg).unwrap();
        let stream = gpu.side_stream().unwrap();
        let nccl =
            NcclCommunicator::connect_named(stream, rank, 2, tcp.store(), timeout, "pipeline-0")
                .unwrap();
        let peer = 1 - rank;
        let mine = gpu.upload(&values(rank, LEN)).unwrap();
        let mut theirs = gpu.upload(&vec![0.0_f32; LEN]).unwrap();
        let mut one_way = gpu.upload(&[0.0_f32; 7]).unwrap();
        nccl.stream().join(gpu.stream()).unwrap();
        // SAFETY: the buffers outlive `nccl.wait()`, which returns once the
        // exchanges completed, and no other stream touches them meanwhile.
        unsafe {
            nccl.send_recv(Some((&mine, peer)), Some((&mut theirs, peer)), "exchange")
                .unwrap();
            if rank == 0 {
                nccl.send_recv(None::<(&Buf, usize)>, Some((&mut one_way, peer)), "one way")
                    .unwrap();
            } else {
                let seven = gpu.upload(&values(rank, 7)).unwrap();
                nccl.send_recv(Some((&seven, peer)), None::<(&mut Buf, usize)>, "one way")
                    .unwrap();
                nccl.wait().unwrap();
            }
        }
        nccl.wait().unwrap();
        // SAFETY: refused before anything is queued.
        let refused =
            unsafe { nccl.send_recv(Some((&mine, rank)), None::<(&mut Buf, usize)>, "self") };
        assert!(
            refused
                .unwrap_err()
                .to_string()
                .contains("not another rank")
        );
        (
            gpu.download(&theirs).unwrap(),
            gpu.download(&one_way).unwrap(),
        )
    });
    for (rank, (theirs, one_way)) in got.into_iter().enumerate() {
        assert!(
            theirs == values(1 - rank, LEN),
            "rank {rank} got a wrong message"
        );
        if rank == 0 {
            assert_eq!(one_way, values(1, 7));
        }
    }
}
