//! All-reduce throughput between processes on this machine, in the table
//! nccl-tests' `all_reduce_perf` prints: over comm's TCP ring (Unix sockets
//! or TCP loopback) or over NCCL on the GPUs.
//!
//! `cargo bench -p benches --bench allreduce -- --ranks 2 [--transport unix|tcp|nccl]`
//!
//! The process started by cargo is rank 0 and prints the table; it starts
//! the other ranks by re-executing itself with `COMM_BENCH_RANK` set (NCCL
//! rank `r` takes GPU `r`). Every size and mode is checked: rank `r` fills
//! element `i` with `(r + 1) * (i % 97)`, so the sum is known exactly;
//! mismatches are counted in `#wrong`, and any make the benchmark exit
//! non-zero. Timing runs on zeros (in place) or an unchanging input (out of
//! place), so repeated sums never overflow.

mod nccl;
mod table;
mod tcp;

use std::process::{Child, Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, ValueEnum};
use comm::{CommConfig, Communicator, ReduceOp, SameHostTransport, TcpCommunicator};

use table::Cell;

const RANK_VAR: &str = "COMM_BENCH_RANK";
const PORT_VAR: &str = "COMM_BENCH_PORT";

/// What carries the all-reduce.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// comm's ring over Unix domain sockets, its default on one machine.
    Unix,
    /// comm's ring over TCP loopback, as between machines.
    Tcp,
    /// NCCL on device buffers, one GPU per rank.
    Nccl,
}

#[derive(Parser, Debug)]
#[command(about = "All-reduce bandwidth between local processes (nccl-tests style)")]
struct Args {
    /// Number of ranks (processes); NCCL needs a GPU for each.
    #[arg(long, default_value_t = 2)]
    ranks: usize,
    /// Smallest message in bytes.
    #[arg(long, default_value_t = 8)]
    min_bytes: usize,
    /// Largest message in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Ratio between consecutive sizes.
    #[arg(long, default_value_t = 2)]
    step_factor: usize,
    /// Explicit message sizes in bytes (comma-separated); replaces the
    /// min/max/step series.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Timed iterations per size and mode.
    #[arg(long, default_value_t = 20)]
    iters: u32,
    /// Untimed iterations per size and mode before timing.
    #[arg(long, default_value_t = 5)]
    warmup: u32,
    #[arg(long, value_enum, default_value_t = Transport::Unix)]
    transport: Transport,
    /// Timeout in seconds for every collective (hang detection).
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
}

/// One rank's side of the benchmark, for one transport.
trait Collective {
    /// Sizes the buffers for `count` elements: the input filled with
    /// [`fill_value`], the output and the in-place buffer zeroed.
    fn prepare(&mut self, count: usize) -> Result<()>;
    /// Starts one sum all-reduce: input → output, or the in-place buffer.
    fn run(&mut self, in_place: bool) -> Result<()>;
    /// Waits for every started all-reduce.
    fn wait(&mut self) -> Result<()>;
    /// Copies the input into the in-place buffer (for its check).
    fn reset_work(&mut self) -> Result<()>;
    /// The last result, on the host.
    fn result(&mut self, in_place: bool) -> Result<Vec<f32>>;
    /// Host collectives for statistics and barriers.
    fn control(&mut self) -> &mut dyn Communicator;
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
    let least = if args.transport == Transport::Nccl {
        1
    } else {
        2
    };
    if args.ranks < least {
        bail!("--ranks must be at least {least} (got {})", args.ranks);
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
    let timeout = Duration::from_secs(args.timeout_secs);
    let tcp = |same_host| -> Result<TcpCommunicator> {
        let config = CommConfig::new(rank, args.ranks, "127.0.0.1", port)
            .with_timeout(timeout)
            .with_same_host(same_host);
        TcpCommunicator::connect(&config).with_context(|| format!("rank {rank} joining"))
    };
    let (mut collective, title): (Box<dyn Collective>, String) = match args.transport {
        Transport::Unix | Transport::Tcp => {
            let (same_host, link) = match args.transport {
                Transport::Unix => (SameHostTransport::UnixSocket, "unix domain sockets"),
                _ => (SameHostTransport::Tcp, "TCP over 127.0.0.1"),
            };
            let cpus = std::thread::available_parallelism().map_or(0, |p| p.get());
            let title = format!(
                "comm all_reduce_perf: TcpCommunicator ring, {} ranks (processes), {link}, {cpus} CPUs",
                args.ranks
            );
            (Box::new(tcp::TcpRank::new(tcp(same_host)?)), title)
        }
        Transport::Nccl => {
            let control = tcp(SameHostTransport::default())?;
            let rank = nccl::NcclRank::connect(rank, args.ranks, control, timeout)?;
            let (major, minor, patch) = comm::nccl::require_nccl()?;
            let title = format!(
                "comm all_reduce_perf: NCCL {major}.{minor}.{patch}, {} ranks (processes), rank 0 on {}",
                args.ranks,
                rank.describe()
            );
            (Box::new(rank), title)
        }
    };
    let c = collective.as_mut();
    if rank == 0 {
        table::print_header(&title, sizes, args.warmup, args.iters);
    }
    let mut total_wrong = 0.0;
    let mut busbw = Vec::new();
    for &bytes in sizes {
        c.prepare(bytes / size_of::<f32>())?;
        let out_of_place = measure(c, args, false)?;
        let in_place = measure(c, args, true)?;
        total_wrong += out_of_place.wrong + in_place.wrong;
        busbw.push(table::busbw(bytes, args.ranks, in_place));
        if rank == 0 {
            table::print_row(bytes, args.ranks, out_of_place, in_place);
        }
    }
    if rank == 0 {
        table::print_footer(total_wrong, &busbw);
    }
    Ok(total_wrong == 0.0)
}

/// Times one mode of the prepared size, checks one result, and reduces both
/// over the ranks.
fn measure(c: &mut dyn Collective, args: &Args, in_place: bool) -> Result<Cell> {
    for _ in 0..args.warmup {
        c.run(in_place)?;
    }
    c.wait()?;
    c.control().barrier()?;
    let start = Instant::now();
    for _ in 0..args.iters {
        c.run(in_place)?;
    }
    c.wait()?;
    let seconds = start.elapsed().as_secs_f64() / f64::from(args.iters.max(1));

    if in_place {
        c.reset_work()?;
        c.run(true)?;
        c.wait()?;
    }
    let result = c.result(in_place)?;
    let n = c.control().world_size();
    let scale = (n * (n + 1) / 2) as f32;
    let wrong = result
        .iter()
        .enumerate()
        .filter(|&(i, &x)| x != scale * (i % 97) as f32)
        .count();
    // [mean time over ranks, wrong elements summed over ranks]
    let mut stats = [seconds, wrong as f64];
    c.control().all_reduce_f64(&mut stats, ReduceOp::Sum)?;
    Ok(Cell {
        seconds: stats[0] / n as f64,
        wrong: stats[1],
    })
}
