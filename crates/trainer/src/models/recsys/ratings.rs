//! MovieLens `ratings.csv` (`userId,movieId,rating,timestamp`, the
//! ml-latest-small and ml-25m format), never loaded whole: one streaming
//! pass validates every line and splits the file into chunks at line
//! starts (about a 64th of the file, from 4 KiB to [`CHUNK_BYTES`]), counting each chunk's training and test
//! ratings; afterwards a rank reads only its own chunks, one at a time.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use core_tensor::rng;

use crate::data::{DataFingerprint, Hasher};

/// User and movie ids index embedding rows: at most this many of each.
pub const MAX_ID: u32 = 1 << 24;
/// The most a chunk grows to before the next line starts a new one.
pub const CHUNK_BYTES: u64 = 1 << 20;
/// Chunks per file when that keeps them between 4 KiB and [`CHUNK_BYTES`]:
/// enough for the ranks' shards to stay balanced on a small file.
const CHUNKS: u64 = 64;
const HEADER: &str = "userId,movieId,rating";

/// One rating.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rating {
    pub user: u32,
    pub item: u32,
    pub rating: f32,
}

impl Rating {
    /// The held-out 10%: a deterministic hash of (user, movie), so every
    /// rank and every run agree without coordination.
    pub fn is_test(&self) -> bool {
        rng::derive_seed(0x7e57, &[u64::from(self.user), u64::from(self.item)]).is_multiple_of(10)
    }
}

/// A run of whole lines: bytes `start..end`, the first being line `first_line`.
#[derive(Clone, Debug, PartialEq)]
pub struct Chunk {
    pub start: u64,
    pub end: u64,
    pub first_line: u64,
    pub train: usize,
    pub test: usize,
}

/// An id and the line (from 1) where it first appears.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LargestId {
    pub id: u32,
    pub line: u64,
}

/// What the first pass learned about a ratings file.
#[derive(Clone, Debug)]
pub struct RatingsIndex {
    pub path: PathBuf,
    /// One more than the largest user id, and movie id.
    pub users: u32,
    pub items: u32,
    /// The largest user id and movie id, and the line each first appears on.
    pub largest: [LargestId; 2],
    pub chunks: Vec<Chunk>,
    /// Mean and standard deviation of the training ratings.
    pub mean: f64,
    pub std: f64,
    /// The training ratings' and the test ratings' identity: each split's
    /// (user, movie, rating) in file order, and the chunks (which order
    /// an epoch), hashed in the same pass.
    pub fingerprints: [DataFingerprint; 2],
}

/// Parses line number `number` (from 1) of the file.
pub fn parse_line(line: &str, number: u64) -> anyhow::Result<Rating> {
    let bad = |why: &str| {
        anyhow::anyhow!(
            "line {number}: {why} (want `userId,movieId,rating,timestamp`, got {:?})",
            line.chars().take(80).collect::<String>()
        )
    };
    let mut fields = line.split(',');
    let mut id = |what: &str| -> anyhow::Result<u32> {
        let field = fields.next().ok_or_else(|| bad(&format!("no {what}")))?;
        let id: u64 = field
            .trim()
            .parse()
            .map_err(|_| bad(&format!("{what} is not a whole number")))?;
        if id >= u64::from(MAX_ID) {
            bail!(
                "line {number}: {what} {id} is beyond the limit of {} (ids index embedding rows; renumber the ids)",
                MAX_ID - 1
            );
        }
        Ok(id as u32)
    };
    let (user, item) = (id("userId")?, id("movieId")?);
    let rating: f32 = fields
        .next()
        .and_then(|f| f.trim().parse().ok())
        .filter(|r: &f32| r.is_finite())
        .ok_or_else(|| bad("the rating is not a number"))?;
    if rating.abs() > MAX_RATING {
        return Err(bad(&format!(
            "the rating {rating} is beyond ±{MAX_RATING} (its square would swamp the loss)"
        )));
    }
    if fields.next().is_none() {
        return Err(bad("no timestamp"));
    }
    Ok(Rating { user, item, rating })
}

/// The longest line a ratings file may have: a MovieLens line is about 30
/// bytes, and an endless one (`/dev/zero`, a binary file) must not be read
/// into memory whole.
const MAX_LINE_BYTES: u64 = 4096;

/// The largest rating magnitude: far above any rating scale, far below
/// where its square overflows `f32`.
const MAX_RATING: f32 = 1e6;

/// Appends line `number` (newline included) to `line`; its byte count, 0 at
/// the end of the file.
fn read_line(reader: &mut impl BufRead, line: &mut String, number: u64) -> anyhow::Result<usize> {
    let read = reader.take(MAX_LINE_BYTES).read_line(line).map_err(|e| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            anyhow::anyhow!("line {number} is not UTF-8 text: not a ratings.csv")
        } else {
            anyhow::Error::new(e).context(format!("reading line {number}"))
        }
    })?;
    if read as u64 == MAX_LINE_BYTES && !line.ends_with('\n') {
        bail!("line {number} is longer than {MAX_LINE_BYTES} bytes: not a ratings.csv");
    }
    Ok(read)
}

impl RatingsIndex {
    /// The first pass over `path`: streams the file once.
    pub fn build(path: &Path) -> anyhow::Result<Self> {
        let cannot_open = || {
            format!(
                "--ratings {}: cannot open it (cargo xtask fetch-data movielens downloads one)",
                path.display()
            )
        };
        // Asked before opening: opening a FIFO without a writer blocks, and
        // a pipe (`<(...)`) cannot be read again by each chunk.
        let meta = std::fs::metadata(path).with_context(cannot_open)?;
        if meta.is_dir() {
            bail!(
                "--ratings {}: is a directory; give the ratings.csv file in it",
                path.display()
            );
        }
        if !meta.is_file() {
            bail!(
                "--ratings {}: must be a regular file, not a pipe or a device (the ratings are read several times, in chunks)",
                path.display()
            );
        }
        let file = File::open(path).with_context(cannot_open)?;
        let size = meta.len();
        let chunk_bytes = (size / CHUNKS).clamp(4096, CHUNK_BYTES);
        let mut reader = BufReader::with_capacity(1 << 16, file);
        let mut line = String::new();
        let mut offset = read_line(&mut reader, &mut line, 1)
            .with_context(|| format!("--ratings {}", path.display()))?
            as u64;
        if offset == 0 {
            bail!("--ratings {}: the file is empty", path.display());
        }
        // A byte order mark, as some editors and spreadsheets write.
        if !line.trim_start_matches('\u{feff}').starts_with(HEADER) {
            bail!(
                "--ratings {}: line 1 is not the header `{HEADER},timestamp` of MovieLens ratings.csv",
                path.display()
            );
        }
        let (mut users, mut items) = (0u32, 0u32);
        let mut largest = [LargestId::default(); 2];
        // The first of the empty lines read since the last rating: allowed
        // at the end of the file only.
        let mut blank_since = None;
        let (mut sum, mut sum_sq) = (0.0f64, 0.0f64);
        let mut chunks = Vec::new();
        let mut hashers = [Hasher::new(), Hasher::new()];
        let mut chunk = Chunk {
            start: offset,
            end: offset,
            first_line: 2,
            train: 0,
            test: 0,
        };
        for number in 2.. {
            line.clear();
            let read = read_line(&mut reader, &mut line, number)
                .with_context(|| format!("--ratings {}", path.display()))?;
            if read == 0 {
                break;
            }
            offset += read as u64;
            if line.trim().is_empty() {
                blank_since.get_or_insert(number);
                continue;
            }
            if let Some(blank) = blank_since {
                bail!(
                    "--ratings {}: line {blank} is empty (empty lines may only end the file)",
                    path.display()
                );
            }
            let r = parse_line(line.trim_end_matches(['\n', '\r']), number)
                .with_context(|| format!("--ratings {}", path.display()))?;
            (users, items) = (users.max(r.user + 1), items.max(r.item + 1));
            for (l, id) in largest.iter_mut().zip([r.user, r.item]) {
                if id > l.id || l.line == 0 {
                    *l = LargestId { id, line: number };
                }
            }
            let held_out = r.is_test();
            let mut bytes = [0u8; 12];
            for (out, word) in bytes
                .chunks_exact_mut(4)
                .zip([r.user, r.item, r.rating.to_bits()])
            {
                out.copy_from_slice(&word.to_le_bytes());
            }
            hashers[usize::from(held_out)].write(&bytes);
            if held_out {
                chunk.test += 1;
            } else {
                chunk.train += 1;
                sum += f64::from(r.rating);
                sum_sq += f64::from(r.rating) * f64::from(r.rating);
            }
            chunk.end = offset;
            if chunk.end - chunk.start >= chunk_bytes {
                let next = Chunk {
                    start: offset,
                    end: offset,
                    first_line: number + 1,
                    train: 0,
                    test: 0,
                };
                chunks.push(std::mem::replace(&mut chunk, next));
            }
        }
        if chunk.end > chunk.start {
            chunks.push(chunk);
        }
        let train: usize = chunks.iter().map(|c| c.train).sum();
        if train == 0 {
            bail!("--ratings {}: no training ratings in it", path.display());
        }
        let mean = sum / train as f64;
        let test: usize = chunks.iter().map(|c| c.test).sum();
        // The chunks order an epoch: the same ratings cut otherwise would
        // be batched in another order.
        let seal = |mut h: Hasher, count: usize| {
            for c in &chunks {
                for value in [c.start, c.end, c.train as u64, c.test as u64] {
                    h.write_u64(value);
                }
            }
            h.finish(count as u64)
        };
        let [train_ratings, test_ratings] = hashers;
        let fingerprints = [seal(train_ratings, train), seal(test_ratings, test)];
        Ok(Self {
            fingerprints,
            path: path.to_path_buf(),
            users,
            items,
            largest,
            chunks,
            mean,
            std: (sum_sq / train as f64 - mean * mean).max(0.0).sqrt(),
        })
    }

    /// Training and test ratings in the whole file.
    pub fn counts(&self) -> (usize, usize) {
        let train = self.chunks.iter().map(|c| c.train).sum();
        (train, self.chunks.iter().map(|c| c.test).sum())
    }

    /// The ratings of chunk `i` (read from disk now), appended to `out`;
    /// `test` picks the held-out ones or the others.
    pub fn read_chunk(&self, i: usize, test: bool, out: &mut Vec<Rating>) -> anyhow::Result<()> {
        let c = &self.chunks[i];
        let reading = || {
            format!(
                "--ratings {}: reading lines from {}",
                self.path.display(),
                c.first_line
            )
        };
        let mut file = File::open(&self.path)
            .with_context(|| format!("--ratings {}: reopening it", self.path.display()))?;
        file.seek(SeekFrom::Start(c.start)).with_context(reading)?;
        let mut bytes = Vec::with_capacity((c.end - c.start) as usize);
        file.take(c.end - c.start)
            .read_to_end(&mut bytes)
            .with_context(reading)?;
        let text = std::str::from_utf8(&bytes).with_context(|| {
            format!(
                "--ratings {}: lines from {} are not UTF-8 (did the file change?)",
                self.path.display(),
                c.first_line
            )
        })?;
        for (n, line) in text.lines().enumerate() {
            let r = parse_line(line, c.first_line + n as u64).with_context(|| {
                format!("--ratings {} (did the file change?)", self.path.display())
            })?;
            if r.is_test() == test {
                out.push(r);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` indexed, and the directory its file lives in.
    fn index_of(text: &[u8]) -> (anyhow::Result<RatingsIndex>, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        std::fs::write(&path, text).unwrap();
        (RatingsIndex::build(&path), dir)
    }

    /// What editors and spreadsheets add is accepted: a byte order mark
    /// before the header, empty lines (CRLF ones too) at the end; an empty
    /// line between ratings is an error naming it. The chunks hold the
    /// ratings alone, and each id's largest value is found with its line.
    #[test]
    fn a_bom_and_trailing_empty_lines_are_accepted_an_inner_one_is_not() {
        let ratings = "userId,movieId,rating,timestamp\r\n1,7,4.0,5\r\n9,2,3.0,5\r\n4,7,2.5,5\r\n";
        let plain = index_of(ratings.as_bytes()).0.unwrap();
        let mut text = b"\xef\xbb\xbf".to_vec();
        text.extend_from_slice(ratings.as_bytes());
        let bom = index_of(&text).0.unwrap();
        text.extend_from_slice(b"\r\n\n  \n");
        let (index, _dir) = index_of(&text);
        let index = index.unwrap();
        assert_eq!(index.counts(), plain.counts());
        assert_eq!((index.counts().0 + index.counts().1), 3);
        // The same ratings in the same chunks: trailing lines change nothing.
        assert_eq!(index.fingerprints, bom.fingerprints);
        assert_eq!(index.chunks, bom.chunks);
        assert_eq!(
            index.largest,
            [LargestId { id: 9, line: 3 }, LargestId { id: 7, line: 2 }]
        );
        let mut all = Vec::new();
        for i in 0..index.chunks.len() {
            index.read_chunk(i, false, &mut all).unwrap();
            index.read_chunk(i, true, &mut all).unwrap();
        }
        assert_eq!(all.len(), 3);

        let inner = ratings.replace("9,2,", "\r\n9,2,");
        let err = format!("{:#}", index_of(inner.as_bytes()).0.unwrap_err());
        assert!(err.contains("line 3 is empty"), "{err}");
    }

    /// The training fingerprint follows the training ratings: the same on
    /// every pass over the same file, another for one rating changed (in
    /// place, the chunks unchanged), while the test split's stays.
    #[test]
    fn one_training_rating_changes_the_training_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        super::super::synth::write_ratings(&path, 400, 20, 30, 1).unwrap();
        let first = RatingsIndex::build(&path).unwrap();
        assert_eq!(
            RatingsIndex::build(&path).unwrap().fingerprints,
            first.fingerprints
        );
        let (train, test) = first.counts();
        assert_eq!(
            first.fingerprints.map(|f| f.samples),
            [train as u64, test as u64]
        );
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let n = (1..lines.len())
            .find(|&n| !parse_line(&lines[n], n as u64 + 1).unwrap().is_test())
            .unwrap();
        let mut fields: Vec<&str> = lines[n].split(',').collect();
        fields[2] = if fields[2] == "2.5" { "3.5" } else { "2.5" };
        lines[n] = fields.join(",");
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let changed = RatingsIndex::build(&path).unwrap();
        assert_eq!(changed.chunks, first.chunks);
        assert_ne!(changed.fingerprints[0], first.fingerprints[0]);
        assert_eq!(changed.fingerprints[0].samples, train as u64);
        assert_eq!(changed.fingerprints[1], first.fingerprints[1]);
    }
}
