//! How the verdict writes ranks, nodes and sizes.

use comm::flight::Entry;

/// "rank 5", or "ranks 0-4,6,7".
pub(super) fn ranks(list: &[usize]) -> String {
    match list {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", spans(list)),
    }
}

/// [`ranks`] with their nodes, `nproc` ranks to a node (0: unknown):
/// "rank 5 (node 2)", "ranks 1,5 (nodes 0,2)".
pub(super) fn ranks_on_nodes(list: &[usize], nproc: usize) -> String {
    if nproc == 0 {
        return ranks(list);
    }
    let mut nodes: Vec<usize> = list.iter().map(|r| r / nproc).collect();
    nodes.dedup();
    match nodes.as_slice() {
        [one] => format!("{} (node {one})", ranks(list)),
        _ => format!("{} (nodes {})", ranks(list), spans(&nodes)),
    }
}

/// Ascending numbers as runs: "0-4,6,7" (a run of three or more is
/// spanned).
fn spans(list: &[usize]) -> String {
    let mut sorted = list.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        if j >= i + 2 {
            parts.push(format!("{}-{}", sorted[i], sorted[j]));
        } else {
            parts.extend(sorted[i..=j].iter().map(|r| r.to_string()));
        }
        i = j + 1;
    }
    parts.join(",")
}

/// " (bucket 0, 4.7 MB)", or " (24 B)" for a collective of no bucket.
pub(super) fn about(entry: &Entry) -> String {
    match entry.bucket {
        Some(b) => format!(" (bucket {b}, {})", bytes(entry.bytes)),
        None => format!(" ({})", bytes(entry.bytes)),
    }
}

/// Decimal units, as the all-reduce benchmark's table: "4.7 MB".
pub(super) fn bytes(n: usize) -> String {
    match n {
        0..1_000 => format!("{n} B"),
        1_000..1_000_000 => format!("{:.1} kB", n as f64 / 1e3),
        _ => format!("{:.1} MB", n as f64 / 1e6),
    }
}
