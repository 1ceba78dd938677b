//! Same seed, same machine, same thread count: the same losses, bit for bit.

mod common;

use common::{data_arg, dataset, run, stderr, trainer};

fn losses(seed: &str, metrics: &std::path::Path) -> Vec<String> {
    let out = run(trainer()
        .args([
            "--epochs",
            "2",
            "--max-steps",
            "3",
            "--threads",
            "1",
            "--seed",
            seed,
            "--metrics",
        ])
        .arg(metrics)
        .args(data_arg(dataset())));
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::read_to_string(metrics)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"].to_string())
        .collect()
}

#[test]
fn the_same_seed_gives_the_same_losses_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    let first = losses("7", &dir.path().join("a.jsonl"));
    assert_eq!(first.len(), 2);
    assert_eq!(first, losses("7", &dir.path().join("b.jsonl")));
    assert_ne!(
        first,
        losses("8", &dir.path().join("c.jsonl")),
        "the seed must matter"
    );
}
