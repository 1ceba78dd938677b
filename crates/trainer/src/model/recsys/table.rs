//! The embedding table's size, known from the index pass (ids index its
//! rows directly), checked against the machine before anything that size
//! is made: one id of 16,777,215 in a small file asks for gigabytes, and
//! the starting state's buffers, allocated before the trainer's own memory
//! check, aborted the process when they did not fit.

use anyhow::bail;

use super::HIDDEN;
use super::ratings::RatingsIndex;

/// The model-sized buffers a rank holds at its peak: the weights, their
/// gradients, Adam's two moments, and the starting state handed to the
/// trainer.
pub const COPIES: u64 = 5;

/// Parameters of the model for `index`'s ids with rows of `dim`: the
/// table (a row and a bias per user and per movie) and the MLP.
pub fn parameter_count(index: &RatingsIndex, dim: usize) -> u64 {
    let rows = u64::from(index.users) + u64::from(index.items);
    let d = dim as u64;
    let hidden = HIDDEN as u64;
    rows * (d + 1) + hidden * 2 * d + hidden + hidden + 1
}

/// Refuses `index`'s ids when `local_ranks` ranks on this machine, each
/// holding [`COPIES`] of the parameters, need more than `room` bytes (the
/// machine's memory for this process; `None`: unknown, not checked).
pub fn check_fits(
    index: &RatingsIndex,
    dim: usize,
    local_ranks: usize,
    room: Option<u64>,
) -> anyhow::Result<()> {
    let Some(room) = room else {
        return Ok(());
    };
    let bytes = 4 * parameter_count(index, dim);
    let need = bytes
        .saturating_mul(COPIES)
        .saturating_mul(local_ranks as u64);
    if need <= room {
        return Ok(());
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let [user, movie] = index.largest;
    let (what, id) = if user.id >= movie.id {
        ("userId", user)
    } else {
        ("movieId", movie)
    };
    let ranks = if local_ranks == 1 {
        String::new()
    } else {
        format!(" on each of {local_ranks} ranks here")
    };
    bail!(
        "--ratings {}: the largest id, {what} {} on line {}, makes the embedding table {} rows of {dim} (a row per id up to the largest user's and movie's): {:.1} GiB of parameters; training holds about {COPIES} copies of them{ranks}, {:.1} GiB, but this machine has {:.1} GiB: ids index the table's rows directly, so they must be dense (MovieLens' are small): renumber them 1, 2, 3, ...",
        index.path.display(),
        id.id,
        id.line,
        u64::from(index.users) + u64::from(index.items),
        gib(bytes),
        gib(need),
        gib(room)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One large id among small ones is refused, naming the id, its line
    /// and the sizes; the same table fits where the room is larger.
    #[test]
    fn a_table_past_the_machine_is_refused_naming_the_largest_id() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratings.csv");
        let mut text = String::from("userId,movieId,rating,timestamp\n1,2,3.0,4\n");
        text += "5,2000000,3.0,4\n5,2000000,4.0,4\n3,1,2.0,4\n";
        std::fs::write(&path, text).unwrap();
        let index = RatingsIndex::build(&path).unwrap();
        assert_eq!(index.items, 2_000_001);
        // 2,000,007 rows of 33 floats and the MLP: about 264 MB.
        let bytes = 4 * parameter_count(&index, 32);
        assert_eq!(bytes, 4 * (2_000_007 * 33 + 64 * 64 + 129));
        check_fits(&index, 32, 1, Some(COPIES * bytes)).unwrap();
        check_fits(&index, 32, 1, None).unwrap();
        let err = check_fits(&index, 32, 2, Some(COPIES * bytes))
            .unwrap_err()
            .to_string();
        for needle in [
            "movieId 2000000 on line 3",
            "0.2 GiB of parameters",
            "about 5 copies of them on each of 2 ranks here, 2.5 GiB",
            "this machine has 1.2 GiB",
            "must be dense",
        ] {
            assert!(err.contains(needle), "`{needle}` not in {err}");
        }
    }
}
