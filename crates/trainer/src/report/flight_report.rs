//! `trainer flight-report DIR`: the verdict on the flight records the ranks
//! of a job wrote in DIR, for jobs no launcher of ours watched (srun,
//! torchrun, mpirun), or to read one again.

use std::path::PathBuf;

use anyhow::bail;
use clap::Parser;
use comm::flight::RankRecord;
use launcher::verdict::{Evidence, verdict};

/// Says which rank held a job up, from its ranks' flight records.
#[derive(Debug, Parser)]
#[command(name = "trainer flight-report")]
pub struct FlightReportArgs {
    /// The directory of the records (a run's --flight-recorder).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// Ranks per machine, to name each rank's node [default: not named].
    #[arg(long, value_name = "M")]
    pub nproc_per_node: Option<usize>,
}

/// Runs `trainer flight-report`.
pub fn run(args: &FlightReportArgs) -> anyhow::Result<()> {
    let dir = &args.dir;
    if !dir.is_dir() {
        bail!(
            "{}: no such directory (give a run's --flight-recorder DIR)",
            dir.display()
        );
    }
    let records = RankRecord::read_dir(dir, 0);
    let Some(world) = records.iter().map(|r| r.world).max() else {
        bail!("{}: holds no flight record (rank-R.json)", dir.display());
    };
    for r in &records {
        say!(
            "rank {} (host {}, pid {}): {}",
            r.rank,
            r.host,
            r.pid,
            r.reason
        );
    }
    let evidence = Evidence {
        records: &records,
        world,
        nproc: args.nproc_per_node.unwrap_or(0),
        silent: &[],
    };
    if let Some(said) = verdict(&evidence) {
        say!("verdict: {said}");
    }
    Ok(())
}
