//! All-reduce throughput of `comm::TcpCommunicator` between processes on
//! this machine, reported the way nccl-tests' `all_reduce_perf` reports it.
//!
//! `cargo bench -p benches --bench allreduce -- --ranks 2 --iters 20 [--transport tcp]`
//!
//! The process started by cargo is rank 0 and prints the table; it starts
//! the other ranks by re-executing itself with `COMM_BENCH_RANK` set. Every
//! size is first checked: rank `r` fills element `i` with
//! `(r + 1) * (i % 97)`, so the sum is known exactly; mismatches are counted
//! in `#wrong`, and any make the benchmark exit non-zero.

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use comm::{CommConfig, Communicator, ReduceOp, SameHostTransport, TcpCommunicator};

const RANK_VAR: &str = "COMM_BENCH_RANK";
const PORT_VAR: &str = "COMM_BENCH_PORT";

/// The link between the (same-machine) ranks.
#[derive(ValueEnum, Clone, Copy, Debug)]
enum Transport {
    /// Unix domain sockets, the default between ranks on one machine.
    Unix,
    /// TCP over loopback, as between machines.
    Tcp,
}

impl Transport {
    fn same_host(self) -> SameHostTransport {
        match self {
            Transport::Unix => SameHostTransport::UnixSocket,
            Transport::Tcp => SameHostTransport::Tcp,
        }
    }
}

#[derive(Parser, Debug)]
#[command(
    about = "All-reduce bandwidth of comm's TCP ring between local processes (nccl-tests style)"
)]
struct Args {
    /// Number of ranks (processes).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Smallest message in bytes.
    #[arg(long, default_value_t = 4 << 10)]
    min_bytes: usize,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    max_bytes: usize,
    /// Ratio between consecutive sizes.
    #[arg(long, default_value_t = 2)]
    step_factor: usize,
    /// Explicit message sizes in bytes (comma-separated); replaces the
    /// min/max/step series.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Timed iterations per size.
    #[arg(long, default_value_t = 20)]
    iters: u32,
    /// Untimed iterations per size before timing.
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    /// Link between the ranks.
    #[arg(long, value_enum, default_value_t = Transport::Unix)]
    transport: Transport,
    /// Communicator timeout in seconds (hang detection).
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
}

fn main() -> ExitCode {
    // `cargo bench` appends `--bench` for libtest-style harnesses.
    let argv: Vec<String> = std::env::args().filter(|a| a != "--bench").collect();
    let args = Args::parse_from(&argv);
    match run(&args, &argv[1..]) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("allreduce bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Returns whether every result was correct.
fn run(args: &Args, passthrough: &[String]) -> Result<bool> {
    if args.ranks < 2 {
        bail!("--ranks must be at least 2 (got {})", args.ranks);
    }
    let sizes = sizes(args)?;
    if let Ok(rank) = std::env::var(RANK_VAR) {
        let rank: usize = rank.parse().with_context(|| format!("{RANK_VAR}={rank}"))?;
        let port: u16 = std::env::var(PORT_VAR)
            .context(PORT_VAR)?
            .parse()
            .context(PORT_VAR)?;
        return bench_rank(args, &sizes, rank, port);
    }

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let exe = std::env::current_exe()?;
    let mut workers: Vec<Child> = Vec::new();
    for rank in 1..args.ranks {
        let child = Command::new(&exe)
            .args(passthrough)
            .env(RANK_VAR, rank.to_string())
            .env(PORT_VAR, port.to_string())
            .spawn()
            .with_context(|| format!("starting rank {rank}"))?;
        workers.push(child);
    }
    let outcome = bench_rank(args, &sizes, 0, port);
    let mut workers_ok = true;
    for (i, mut w) in workers.into_iter().enumerate() {
        if outcome.is_err() {
            // Rank 0 failed; its peers would only wait for their timeout.
            let _ = w.kill();
        }
        let status = w
            .wait()
            .with_context(|| format!("waiting for rank {}", i + 1))?;
        workers_ok &= status.success();
    }
    let correct = outcome?;
    if !workers_ok {
        bail!("a worker rank failed");
    }
    Ok(correct)
}

fn sizes(args: &Args) -> Result<Vec<usize>> {
    let sizes: Vec<usize> = if args.sizes.is_empty() {
        if args.step_factor < 2 || args.min_bytes == 0 {
            bail!("--step-factor must be at least 2 and --min-bytes positive");
        }
        std::iter::successors(Some(args.min_bytes), |&b| b.checked_mul(args.step_factor))
            .take_while(|&b| b <= args.max_bytes)
            .collect()
    } else {
        args.sizes.clone()
    };
    if let Some(bad) = sizes.iter().find(|&&b| b % size_of::<f32>() != 0) {
        bail!("message size {bad} is not a whole number of f32 elements");
    }
    Ok(sizes)
}

/// Element `i` of rank `rank`; sums over ranks stay small integers, exact in f32.
fn fill_value(rank: usize, i: usize) -> f32 {
    ((rank + 1) * (i % 97)) as f32
}

fn bench_rank(args: &Args, sizes: &[usize], rank: usize, port: u16) -> Result<bool> {
    let config = CommConfig::new(rank, args.ranks, "127.0.0.1", port)
        .with_timeout(Duration::from_secs(args.timeout_secs))
        .with_same_host(args.transport.same_host());
    let mut comm =
        TcpCommunicator::connect(&config).with_context(|| format!("rank {rank} joining"))?;
    let n = args.ranks;
    let print = rank == 0;
    if print {
        print_header(args, sizes);
    }
    let mut total_wrong = 0.0_f64;
    let mut busbw_sum = 0.0;
    for &bytes in sizes {
        let count = bytes / size_of::<f32>();
        // Timing runs on zeros: the sums never overflow however many
        // iterations run, and the speed of an add does not depend on values.
        let mut work = vec![0.0_f32; count];
        for _ in 0..args.warmup {
            comm.all_reduce(&mut work, ReduceOp::Sum)?;
        }
        comm.barrier()?;
        let start = Instant::now();
        for _ in 0..args.iters {
            comm.all_reduce(&mut work, ReduceOp::Sum)?;
        }
        let seconds = start.elapsed().as_secs_f64() / f64::from(args.iters.max(1));

        let mut check: Vec<f32> = (0..count).map(|i| fill_value(rank, i)).collect();
        comm.all_reduce(&mut check, ReduceOp::Sum)?;
        let scale = (n * (n + 1) / 2) as f32;
        let wrong = check
            .iter()
            .enumerate()
            .filter(|&(i, &x)| x != scale * (i % 97) as f32)
            .count();

        // [mean time over ranks, wrong elements summed over ranks]
        let mut stats = [seconds, wrong as f64];
        comm.all_reduce_f64(&mut stats, ReduceOp::Sum)?;
        let time = stats[0] / n as f64;
        let algbw = bytes as f64 / time / 1e9;
        let busbw = algbw * 2.0 * (n - 1) as f64 / n as f64;
        total_wrong += stats[1];
        busbw_sum += busbw;
        if print {
            println!(
                "{bytes:>12} {count:>12} {:>9} {:>7} {:>10.1} {:>7.2} {:>7.2} {:>7}",
                "float",
                "sum",
                time * 1e6,
                algbw,
                busbw,
                stats[1]
            );
        }
    }
    if print {
        let status = if total_wrong == 0.0 { "OK" } else { "FAILED" };
        println!("# Out of bounds values : {total_wrong} {status}");
        println!(
            "# Avg bus bandwidth    : {:.4} GB/s",
            busbw_sum / sizes.len().max(1) as f64
        );
        println!("#");
    }
    Ok(total_wrong == 0.0)
}

fn print_header(args: &Args, sizes: &[usize]) {
    let cpus = std::thread::available_parallelism().map_or(0, |p| p.get());
    let link = match args.transport {
        Transport::Unix => "unix domain sockets",
        Transport::Tcp => "TCP over 127.0.0.1",
    };
    println!(
        "# comm all_reduce_perf: TcpCommunicator ring, {} ranks (processes), {link}",
        args.ranks
    );
    println!(
        "#  minBytes {} maxBytes {} sizes {}  warmup iters: {} iters: {} validation: 1  op: sum (in place)",
        sizes.first().copied().unwrap_or(0),
        sizes.last().copied().unwrap_or(0),
        sizes.len(),
        args.warmup,
        args.iters,
    );
    println!("#  host: {cpus} CPUs; time is the mean over iterations and ranks");
    println!("#");
    println!(
        "# {:>10} {:>12} {:>9} {:>7} {:>10} {:>7} {:>7} {:>7}",
        "size", "count", "type", "redop", "time", "algbw", "busbw", "#wrong"
    );
    println!(
        "# {:>10} {:>12} {:>9} {:>7} {:>10} {:>7} {:>7} {:>7}",
        "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", ""
    );
}
