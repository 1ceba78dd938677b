//! The parts of the NCCL transport that need no GPU: passing the unique id
//! through the store, and finding (or explaining the absence of) libnccl.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use comm::nccl::{
    NcclSearch, SearchRoots, UNIQUE_ID_BYTES, exchange_unique_id, require_nccl, search,
};
use comm::{CommError, Store, StoreServer};
use common::config;

const TIMEOUT: Duration = Duration::from_secs(5);

fn fake_id(seed: u8) -> [u8; UNIQUE_ID_BYTES] {
    std::array::from_fn(|i| seed.wrapping_add(i as u8))
}

#[test]
fn every_rank_gets_rank_0s_unique_id_and_only_rank_0_makes_one() {
    let world_size = 4;
    let server = StoreServer::bind("127.0.0.1", 0, world_size, TIMEOUT).unwrap();
    let port = server.port();
    let ids: Vec<_> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..world_size)
            .map(|rank| {
                s.spawn(move || {
                    let mut store =
                        Store::connect(&config(rank, world_size, port, TIMEOUT)).unwrap();
                    // Rank 0 publishes late: the others must wait for it.
                    if rank == 0 {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    let id = exchange_unique_id(&mut store, rank, "gradients", || {
                        assert_eq!(rank, 0, "rank {rank} was asked to make the id");
                        Ok(fake_id(7))
                    });
                    (id.unwrap(), store)
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap().0).collect()
    });
    assert!(ids.iter().all(|id| *id == fake_id(7)), "{ids:?}");
}

#[test]
fn communicators_with_different_names_get_their_own_ids() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, TIMEOUT).unwrap();
    let mut zero = Store::connect(&config(0, 2, server.port(), TIMEOUT)).unwrap();
    let mut one = Store::connect(&config(1, 2, server.port(), TIMEOUT)).unwrap();
    exchange_unique_id(&mut zero, 0, "a", || Ok(fake_id(1))).unwrap();
    exchange_unique_id(&mut zero, 0, "b", || Ok(fake_id(2))).unwrap();
    let never = || unreachable!("only rank 0 makes ids");
    assert_eq!(
        exchange_unique_id(&mut one, 1, "b", never).unwrap(),
        fake_id(2)
    );
    assert_eq!(
        exchange_unique_id(&mut one, 1, "a", never).unwrap(),
        fake_id(1)
    );
}

#[test]
fn a_rank_0_that_never_publishes_is_a_timeout_naming_the_key() {
    let short = Duration::from_millis(200);
    let server = StoreServer::bind("127.0.0.1", 0, 2, short).unwrap();
    let _zero = Store::connect(&config(0, 2, server.port(), short)).unwrap();
    let mut one = Store::connect(&config(1, 2, server.port(), short)).unwrap();
    let err = exchange_unique_id(&mut one, 1, "gradients", || unreachable!()).unwrap_err();
    assert!(
        matches!(&err, CommError::StoreTimeout { key, .. } if key.contains("nccl/gradients")),
        "{err}"
    );
}

#[test]
fn a_value_of_the_wrong_size_is_refused() {
    let server = StoreServer::bind("127.0.0.1", 0, 2, TIMEOUT).unwrap();
    let mut zero = Store::connect(&config(0, 2, server.port(), TIMEOUT)).unwrap();
    let mut one = Store::connect(&config(1, 2, server.port(), TIMEOUT)).unwrap();
    zero.set("comm/nccl/gradients/unique-id", b"short").unwrap();
    let err = exchange_unique_id(&mut one, 1, "gradients", || unreachable!()).unwrap_err();
    assert!(err.to_string().contains("5 bytes, not the 128"), "{err}");
}

/// A fake machine: a virtual environment with NCCL's wheel (`libnccl.so.2`
/// only, as pip installs it) and an empty toolkit.
fn fake_tree(root: &Path) -> SearchRoots {
    let wheel = root.join("venv/lib/python3.11/site-packages/nvidia/nccl/lib");
    std::fs::create_dir_all(&wheel).unwrap();
    std::fs::write(wheel.join("libnccl.so.2"), b"").unwrap();
    std::fs::create_dir_all(root.join("cuda/lib64")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    SearchRoots {
        ld_library_path: Some(root.join("empty").into_os_string()),
        system: vec![root.join("no-such-dir")],
        toolkits: vec![root.join("cuda")],
        python_prefixes: vec![root.join("venv")],
    }
}

#[test]
fn a_wheels_versioned_library_is_found_and_the_fix_links_it() {
    let dir = tempfile::tempdir().unwrap();
    let report = search(&fake_tree(dir.path()));
    let wheel_lib: PathBuf = dir
        .path()
        .join("venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2");
    assert_eq!(report.found(), Some(wheel_lib.as_path()));
    let kinds: Vec<_> = report.searched.iter().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            "LD_LIBRARY_PATH",
            "system",
            "CUDA/NCCL install",
            "CUDA/NCCL install",
            "Python wheel"
        ]
    );
    let text = report.to_string();
    assert!(
        text.contains(&format!("ln -sf {}", wheel_lib.display())),
        "{text}"
    );
    assert!(text.contains("LD_LIBRARY_PATH"), "{text}");
}

#[test]
fn with_nothing_found_the_report_says_how_to_install_nccl() {
    let dir = tempfile::tempdir().unwrap();
    let mut roots = fake_tree(dir.path());
    roots.python_prefixes.clear();
    let report: NcclSearch = search(&roots);
    assert_eq!(report.found(), None);
    let text = report.to_string();
    for expected in [
        "nvidia-nccl-cu12",
        "libnccl2",
        "--backend tcp",
        "cuda/lib64: nothing",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn an_unversioned_library_off_the_loader_path_is_pointed_at() {
    let dir = tempfile::tempdir().unwrap();
    let mut roots = fake_tree(dir.path());
    roots.python_prefixes.clear();
    std::fs::write(dir.path().join("cuda/lib64/libnccl.so"), b"").unwrap();
    let text = search(&roots).to_string();
    let lib64 = dir.path().join("cuda/lib64");
    assert!(
        text.contains(&format!("export LD_LIBRARY_PATH={}:", lib64.display())),
        "{text}"
    );
}

/// On this machine the library is either loadable (then its version is
/// reported) or not (then the error is the search report): never a panic.
#[test]
fn require_nccl_reports_a_version_or_the_search() {
    match require_nccl() {
        Ok((major, minor, _)) => {
            eprintln!("libnccl {major}.{minor} is loadable here");
            assert_eq!(major, 2, "NCCL 2.x expected");
        }
        Err(CommError::NcclMissing(report)) => {
            eprintln!("libnccl is not loadable here:\n{report}");
            assert!(report.to_string().contains("no `libnccl.so`"));
            assert!(!report.searched.is_empty());
        }
        Err(other) => panic!("unexpected error: {other}"),
    }
}
