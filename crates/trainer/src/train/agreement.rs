//! Checking, before training starts, that every rank holds rank 0's
//! values of what a job must share: the flags of [`Cli::shared_flags`] and
//! the training data (each rank reads its own copy; another host's may
//! differ).
//!
//! [`Cli::shared_flags`]: crate::cli::Cli::shared_flags

use anyhow::{Context, anyhow, bail};

use crate::comm_thread::CommThread;

/// One thing every rank must hold alike, and what the refusal says of it.
pub struct Agreed {
    /// Its name among the others sent (no spaces): a flag, `training-data`.
    key: &'static str,
    /// How a refusal names it.
    what: &'static str,
    value: String,
    /// What to make alike when it differs.
    fix: &'static str,
}

impl Agreed {
    /// A flag's value, as [`Cli::shared_flags`] gives it.
    ///
    /// [`Cli::shared_flags`]: crate::cli::Cli::shared_flags
    pub fn flag((flag, value): (&'static str, String)) -> Agreed {
        Agreed {
            key: flag,
            what: flag,
            value,
            fix: "every rank needs the same flags",
        }
    }

    /// The training data, by their size and fingerprint.
    pub fn training_data(fingerprint: impl std::fmt::Display) -> Agreed {
        Agreed {
            key: "training-data",
            what: "training data",
            value: format!("({fingerprint})"),
            fix: "every rank needs the same data set (the same files, or --data-dir, on every host)",
        }
    }
}

/// Fails on a rank whose values differ from rank 0's, naming the first
/// that differs with both values. Every rank calls it (two broadcasts: the
/// length of rank 0's list, then the list).
pub fn check(comm: &mut CommThread, agreed: &[Agreed]) -> anyhow::Result<()> {
    let rank = comm.rank();
    let mine = encode(agreed);
    let mut len = vec![mine.len() as f32];
    comm.broadcast(&mut len, 0)
        .context("receiving rank 0's flags")?;
    let mut root = match len[..] {
        _ if rank == 0 => mine,
        [n] if n.fract() == 0.0 && (0.0..16_777_216.0).contains(&n) => vec![0.0; n as usize],
        _ => bail!("rank 0's flags arrived garbled"),
    };
    comm.broadcast(&mut root, 0)
        .context("receiving rank 0's flags")?;
    let root = decode(&root)?;
    for Agreed {
        key,
        what,
        value,
        fix,
    } in agreed
    {
        match root.iter().find(|(k, _)| k == key) {
            Some((_, v)) if v == value => {}
            Some((_, v)) => {
                bail!("rank {rank} has {what} {value} but rank 0 has {what} {v}: {fix}")
            }
            None => bail!("rank 0 does not check {what}: every rank needs the same trainer build"),
        }
    }
    if root.len() != agreed.len() {
        bail!(
            "rank 0 checks other flags than rank {rank}: every rank needs the same trainer build"
        );
    }
    Ok(())
}

/// `flag value` lines, a byte per f32 (exact).
fn encode(agreed: &[Agreed]) -> Vec<f32> {
    let text: String = agreed
        .iter()
        .map(|a| format!("{} {}\n", a.key, a.value))
        .collect();
    text.bytes().map(f32::from).collect()
}

fn decode(buf: &[f32]) -> anyhow::Result<Vec<(String, String)>> {
    let garbled = || anyhow!("rank 0's flags arrived garbled");
    let bytes = buf
        .iter()
        .map(|&x| (x.fract() == 0.0 && (0.0..256.0).contains(&x)).then_some(x as u8))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(garbled)?;
    let text = String::from_utf8(bytes).map_err(|_| garbled())?;
    text.lines()
        .map(|line| {
            let (flag, value) = line.split_once(' ').ok_or_else(garbled)?;
            Ok((flag.to_string(), value.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_survive_the_f32_encoding() {
        let flags = [
            Agreed::flag(("--lr", "0.001".to_string())),
            Agreed::flag(("--max-steps", "(not given)".to_string())),
        ];
        let got = decode(&encode(&flags)).unwrap();
        assert_eq!(
            got,
            [
                ("--lr".into(), "0.001".into()),
                ("--max-steps".into(), "(not given)".into())
            ]
        );
        assert!(decode(&[0.5]).is_err());
        assert!(decode(&[300.0]).is_err());
    }
}
