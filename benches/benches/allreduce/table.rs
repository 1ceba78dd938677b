//! The nccl-tests `all_reduce_perf` table: one row per size, out-of-place
//! then in-place columns.

/// One measured mode (out-of-place or in-place) of one size, already
/// reduced over ranks.
#[derive(Clone, Copy, Debug)]
pub struct Cell {
    /// Mean seconds per all-reduce.
    pub seconds: f64,
    /// Wrong elements summed over ranks.
    pub wrong: f64,
}

impl Cell {
    fn bandwidths(&self, bytes: usize, ranks: usize) -> (f64, f64) {
        let algbw = bytes as f64 / self.seconds / 1e9;
        let busbw = algbw * 2.0 * (ranks - 1) as f64 / ranks as f64;
        (algbw, busbw)
    }
}

pub fn print_header(title: &str, sizes: &[usize], warmup: u32, iters: u32) {
    println!("# {title}");
    println!(
        "#  minBytes {} maxBytes {} sizes {}  warmup iters: {warmup} iters: {iters} validation: 1",
        sizes.first().copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0),
        sizes.len(),
    );
    println!("#  time is the mean over iterations and ranks");
    println!("#");
    println!(
        "# {:>10} {:>12} {:>6} {:>6} {:>6} {:>32}  {:>32}",
        "", "", "", "", "", "out-of-place", "in-place"
    );
    println!(
        "# {:>10} {:>12} {:>6} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    println!(
        "# {:>10} {:>12} {:>6} {:>6} {:>6} {:>9} {:>7} {:>7} {:>6}  {:>9} {:>7} {:>7} {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
}

pub fn print_row(bytes: usize, ranks: usize, out_of_place: Cell, in_place: Cell) {
    let count = bytes / size_of::<f32>();
    let (oa, ob) = out_of_place.bandwidths(bytes, ranks);
    let (ia, ib) = in_place.bandwidths(bytes, ranks);
    println!(
        "{bytes:>12} {count:>12} {:>6} {:>6} {:>6} {:>9.1} {oa:>7.2} {ob:>7.2} {:>6}  {:>9.1} {ia:>7.2} {ib:>7.2} {:>6}",
        "float",
        "sum",
        -1,
        out_of_place.seconds * 1e6,
        out_of_place.wrong,
        in_place.seconds * 1e6,
        in_place.wrong,
    );
}

/// The closing lines; `busbw` holds every row's in-place bus bandwidth.
pub fn print_footer(wrong: f64, busbw: &[f64]) {
    let status = if wrong == 0.0 { "OK" } else { "FAILED" };
    println!("# Out of bounds values : {wrong} {status}");
    println!(
        "# Avg bus bandwidth    : {:.4} GB/s",
        busbw.iter().sum::<f64>() / busbw.len().max(1) as f64
    );
    println!("#");
}

/// The in-place bus bandwidth of a row (for the footer's average).
pub fn busbw(bytes: usize, ranks: usize, cell: Cell) -> f64 {
    cell.bandwidths(bytes, ranks).1
}
