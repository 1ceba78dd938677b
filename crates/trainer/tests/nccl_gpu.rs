//! NCCL on a real GPU: the communicator's collectives at world size 1, the
//! bounded initialisation when a peer never comes, the page-locked staging
//! buffers, and the transport choice of two ranks sharing one GPU.
//!
//! Without a GPU (or without libnccl) each test says it was skipped;
//! REQUIRE_GPU=1 (and REQUIRE_NCCL=1) turn that into a failure, as the
//! device bundle's run.sh does.

mod common;

use std::time::{Duration, Instant};

use comm::nccl::{NcclCommunicator, require_nccl};
use comm::{CommError, ReduceOp, Store, StoreServer};
use common::{data_arg, dataset, run, stderr, trainer};
use core_tensor::{Backend, Cuda};

fn required(var: &str) -> bool {
    std::env::var(var).is_ok_and(|v| v == "1")
}

fn gpu(test: &str) -> Option<Cuda> {
    match Cuda::new(0) {
        Ok(gpu) => Some(gpu),
        Err(e) => {
            assert!(
                !required("REQUIRE_GPU"),
                "REQUIRE_GPU=1, but no usable GPU: {e}"
            );
            println!("{test}: skipped: no usable GPU ({e})");
            None
        }
    }
}

/// The GPU, when libnccl loads too.
fn gpu_with_nccl(test: &str) -> Option<Cuda> {
    let gpu = gpu(test)?;
    match require_nccl() {
        Ok(_) => Some(gpu),
        Err(e) => {
            assert!(!required("REQUIRE_NCCL"), "REQUIRE_NCCL=1, but: {e}");
            println!("{test}: skipped: {e}");
            None
        }
    }
}

const TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn one_rank_collectives_keep_values_and_validate_arguments() {
    let Some(gpu) = gpu_with_nccl("one_rank_collectives") else {
        return;
    };
    let nccl = NcclCommunicator::connect(gpu.side_stream().unwrap(), 0, 1, None, TIMEOUT).unwrap();
    let host: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut buf = gpu.upload(&host).unwrap();
    // The collectives run on the communicator's stream: order them after
    // the upload, and the download after them.
    nccl.stream().join(gpu.stream()).unwrap();
    let mut out = gpu.zeros(host.len()).unwrap();
    // SAFETY: `buf` and `out` are locals that nothing else touches until
    // `nccl.wait()` below has seen the three collectives complete.
    unsafe {
        nccl.all_reduce_in_place(&mut buf, ReduceOp::Avg, "test average")
            .unwrap();
        nccl.broadcast_in_place(&mut buf, 0, "test broadcast")
            .unwrap();
        nccl.all_reduce(&buf, &mut out, ReduceOp::Sum, "test sum")
            .unwrap();
    }
    nccl.wait().unwrap();
    assert_eq!(gpu.download(&buf).unwrap(), host);
    assert_eq!(gpu.download(&out).unwrap(), host);
    // SAFETY: refused before anything is queued.
    let err = unsafe { nccl.broadcast_in_place(&mut buf, 1, "bad root") }.unwrap_err();
    assert!(err.to_string().contains("root 1"), "{err}");
    let mut short = gpu.zeros(3).unwrap();
    // SAFETY: refused before anything is queued (the lengths differ).
    let err =
        unsafe { nccl.all_reduce(&buf, &mut short, ReduceOp::Sum, "bad lengths") }.unwrap_err();
    assert!(matches!(err, CommError::InvalidArgument { .. }), "{err}");
    nccl.barrier().unwrap();
}

#[test]
fn a_peer_that_never_joins_ends_initialisation_at_the_timeout() {
    let Some(gpu) = gpu_with_nccl("a_peer_that_never_joins") else {
        return;
    };
    let timeout = Duration::from_secs(3);
    let server = StoreServer::bind("127.0.0.1", 0, 2, timeout).unwrap();
    let config = comm::CommConfig::new(0, 2, "127.0.0.1", server.port()).with_timeout(timeout);
    let mut store = Store::connect(&config).unwrap();
    let started = Instant::now();
    let err =
        NcclCommunicator::connect(gpu.side_stream().unwrap(), 0, 2, Some(&mut store), timeout)
            .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&err, CommError::NcclTimeout { rank: 0, op, .. } if op.contains("ncclCommInitRankConfig")),
        "{err}"
    );
    assert!(
        took >= timeout && took < timeout * 4,
        "returned after {took:?}"
    );
}

#[test]
fn staging_buffers_are_page_locked_and_round_trip() {
    let Some(gpu) = gpu("staging_buffers") else {
        return;
    };
    let host: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let dev = gpu.upload(&host).unwrap();
    let mut staging = gpu.staging(1024).unwrap();
    assert!(staging.is_locked(), "cuMemHostRegister refused 4 KiB");
    gpu.read_range(&dev, 1000..2024, &mut staging).unwrap();
    assert_eq!(&staging[..], &host[1000..2024]);
    let mut back = gpu.zeros::<f32>(1024).unwrap();
    staging.iter_mut().for_each(|x| *x = -*x);
    gpu.write_range(&staging, &mut back, 0).unwrap();
    // write_range returns only once the page-locked source may be reused.
    staging.fill(0.0);
    let expected: Vec<f32> = host[1000..2024].iter().map(|x| -x).collect();
    assert_eq!(gpu.download(&back).unwrap(), expected);
}

/// Two ranks of `trainer --backend <backend>` on this machine's one GPU,
/// for `steps` steps: whether they succeeded, and the launcher's stderr.
fn two_ranks_on_one_gpu(backend: &str, steps: &str) -> (bool, String) {
    let out = run(trainer()
        .args([
            "--world-size",
            "2",
            "--device",
            "cuda",
            "--backend",
            backend,
        ])
        .args(["--epochs", "1", "--max-steps", steps])
        .args(data_arg(dataset())));
    (out.status.success(), stderr(&out))
}

#[test]
fn two_ranks_on_one_gpu_train_over_tcp_under_auto() {
    if gpu("two_ranks_on_one_gpu").is_none() {
        return;
    }
    let (ok, err) = two_ranks_on_one_gpu("auto", "20");
    assert!(ok, "{err}");
    assert!(err.contains("ranks [0, 1] share one GPU"), "{err}");
    assert!(err.contains("gradients over the TCP ring"), "{err}");
}

#[test]
fn two_ranks_on_one_gpu_are_refused_nccl_with_the_way_out() {
    if gpu("two_ranks_refused_nccl").is_none() {
        return;
    }
    // Refused before NCCL is reached: NCCL itself would fail less clearly.
    let (ok, err) = two_ranks_on_one_gpu("nccl", "1");
    assert!(!ok, "{err}");
    assert!(err.contains("ranks [0, 1] share one GPU"), "{err}");
    assert!(err.contains("use --backend tcp"), "{err}");
}

/// The tests above (but the full training run, too slow there) again on
/// `cuda-emu`, whose NCCL runs the collectives through shared memory: the
/// communicator, its watchdog and the staging buffers run without a GPU,
/// and its one GPU is shared by the refused NCCL ranks.
#[test]
fn nccl_tests_on_the_cuda_emulator() {
    cuda_emu::rerun_on_emulator(
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")),
        &[
            "--skip",
            "nccl_tests_on_the_cuda_emulator",
            "--skip",
            "two_ranks_on_one_gpu_train_over_tcp_under_auto",
        ],
        &[("REQUIRE_GPU", "1"), ("REQUIRE_NCCL", "1")],
        4,
    );
}
