//! MovieLens-format ratings with learnable structure, for tests and
//! benchmarks on machines without the real data: every user and movie has
//! four hidden factors and an offset, and a rating is their dot product
//! plus the offsets around 3.5, clamped to 0.5..5 and rounded to halves,
//! as MovieLens ratings are.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use crate::model::unit_f32;

const FACTORS: usize = 4;

/// Writes `rows` ratings by `users` users of `movies` movies (sparse movie
/// ids, as MovieLens has) to `path`, the same for the same `seed`; the
/// users and movies that have a rating in it.
pub fn write_ratings(
    path: &Path,
    rows: u64,
    users: u32,
    movies: u32,
    seed: u64,
) -> anyhow::Result<(u32, u32)> {
    let path = &destination(path)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let uniform = |rng: &mut ChaCha8Rng| 2.0 * unit_f32(rng) - 1.0;
    let factors = |n: u32, rng: &mut ChaCha8Rng| -> Vec<f32> {
        (0..n as usize * (FACTORS + 1))
            .map(|_| uniform(rng))
            .collect()
    };
    let (u, m) = (factors(users, &mut rng), factors(movies, &mut rng));
    // Written beside `path` and renamed into place once complete, so that a
    // full disk or an interrupted run never leaves a truncated file there.
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let file = std::fs::File::create(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let written = write_rows(
        BufWriter::new(file),
        rows,
        users,
        movies,
        (&u, &m),
        &mut rng,
    )
    .and_then(|rated| std::fs::rename(&partial, path).map(|()| rated));
    written
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&partial);
        })
        .with_context(|| format!("writing {}", path.display()))
}

/// Where the file for `path` goes: `path` itself when nothing or a regular
/// file is there, a symlink's target (resolved, so that the rename into
/// place replaces the target and the link stays) when that is a regular
/// file. Anything else is refused before it is touched: renaming over a
/// device, a FIFO or a socket would replace it with a regular file.
fn destination(path: &Path) -> anyhow::Result<PathBuf> {
    let refuse = |what: &str| {
        anyhow::anyhow!(
            "{}: {what}; synth-ratings writes a new file or replaces a regular one",
            path.display()
        )
    };
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => std::fs::canonicalize(path)
            .with_context(|| format!("{}: resolving its symlinks", path.display())),
        Ok(meta) if meta.is_dir() => Err(refuse("is a directory")),
        Ok(_) => Err(refuse(
            "is not a regular file (a device, a FIFO or a socket)",
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(path).is_ok() {
                Err(refuse("is a symlink to nothing"))
            } else {
                Ok(path.to_path_buf())
            }
        }
        Err(e) => Err(e).with_context(|| format!("{}: cannot look at it", path.display())),
    }
}

/// The header and `rows` ratings drawn from `rng` over the factors `u`, `m`;
/// how many users and movies have a rating.
fn write_rows(
    mut out: BufWriter<std::fs::File>,
    rows: u64,
    users: u32,
    movies: u32,
    (u, m): (&[f32], &[f32]),
    rng: &mut ChaCha8Rng,
) -> std::io::Result<(u32, u32)> {
    writeln!(out, "userId,movieId,rating,timestamp")?;
    let mut rated = [vec![false; users as usize], vec![false; movies as usize]];
    for row in 0..rows {
        let user = rng.next_u32_below(users) as usize;
        let movie = rng.next_u32_below(movies) as usize;
        (rated[0][user], rated[1][movie]) = (true, true);
        let (fu, fm) = (
            &u[user * (FACTORS + 1)..][..FACTORS + 1],
            &m[movie * (FACTORS + 1)..][..FACTORS + 1],
        );
        let dot: f32 = fu[..FACTORS]
            .iter()
            .zip(&fm[..FACTORS])
            .map(|(a, b)| a * b)
            .sum();
        let rating = (3.5 + 0.8 * dot + 0.6 * (fu[FACTORS] + fm[FACTORS])).clamp(0.5, 5.0);
        let rating = (rating * 2.0).round() / 2.0;
        writeln!(
            out,
            "{},{},{rating:.1},{}",
            user + 1,
            movie * 3 + 1,
            964_982_703 + row
        )?;
    }
    out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    let [u, m] = rated.map(|seen| seen.iter().filter(|&&s| s).count() as u32);
    Ok((u, m))
}

/// `trainer synth-ratings`: a ratings file to try `--model recsys` on
/// without the real data.
#[derive(Debug, clap::Parser)]
#[command(
    name = "trainer synth-ratings",
    about = "Write a MovieLens-format ratings.csv with learnable structure (hidden user and movie factors), for --model recsys without a network"
)]
pub struct SynthArgs {
    /// The ratings file to write.
    #[arg(value_name = "PATH")]
    pub output: PathBuf,

    /// Ratings to write (at most a billion: about 25 GB).
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub rows: u64,

    /// Users rating.
    #[arg(long, value_name = "N", default_value_t = 1_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub users: u32,

    /// Movies rated (ids are sparse, as in MovieLens: 1, 4, 7, ...).
    #[arg(long, value_name = "N", default_value_t = 2_000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub movies: u32,

    /// Seed of the factors and the ratings.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub seed: u64,
}

/// Writes the file `args` describe.
pub fn run(args: &SynthArgs) -> anyhow::Result<()> {
    let (users, movies) =
        write_ratings(&args.output, args.rows, args.users, args.movies, args.seed)?;
    say!(
        "{}: {} ratings by {users} users of {movies} movies; train on it with --model recsys --ratings {}",
        args.output.display(),
        args.rows,
        args.output.display()
    );
    Ok(())
}

/// A uniform draw below `n` (`n` ≥ 1) from one ChaCha8 word.
trait Below {
    fn next_u32_below(&mut self, n: u32) -> u32;
}

impl Below for ChaCha8Rng {
    fn next_u32_below(&mut self, n: u32) -> u32 {
        ((u64::from(rand::RngCore::next_u32(self)) * u64::from(n)) >> 32) as u32
    }
}
