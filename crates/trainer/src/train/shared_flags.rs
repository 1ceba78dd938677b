//! Checking, before training starts, that every rank was given rank 0's
//! values of the flags a job must share ([`Cli::shared_flags`]).
//!
//! [`Cli::shared_flags`]: crate::cli::Cli::shared_flags

use anyhow::{Context, anyhow, bail};

use crate::ddp::CommThread;

/// The entry that stands for the training data (their fingerprint) among
/// the flags: not a flag, but as much a thing every rank must share (a
/// name without spaces, as every flag's).
pub const TRAINING_DATA: &str = "training-data";

/// Fails on a rank whose `flags` differ from rank 0's, naming the first
/// flag that differs with both values. Every rank calls it (two
/// broadcasts: the length of rank 0's list, then the list).
pub fn check(comm: &mut CommThread, flags: &[(&'static str, String)]) -> anyhow::Result<()> {
    let rank = comm.rank();
    let mine = encode(flags);
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
    for (flag, value) in flags {
        match root.iter().find(|(f, _)| f == flag) {
            Some((_, v)) if v == value => {}
            Some((_, v)) if *flag == TRAINING_DATA => bail!(
                "rank {rank} has other training data than rank 0 ({value}; rank 0: {v}): every rank needs the same data set (the same files, or --data-dir, on every host)"
            ),
            Some((_, v)) => bail!(
                "rank {rank} has {flag} {value} but rank 0 has {flag} {v}: every rank needs the same flags"
            ),
            None => bail!("rank 0 does not check {flag}: every rank needs the same trainer build"),
        }
    }
    if root.len() != flags.len() {
        bail!(
            "rank 0 checks other flags than rank {rank}: every rank needs the same trainer build"
        );
    }
    Ok(())
}

/// `flag value` lines, a byte per f32 (exact).
fn encode(flags: &[(&'static str, String)]) -> Vec<f32> {
    let text: String = flags.iter().map(|(f, v)| format!("{f} {v}\n")).collect();
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
            ("--lr", "0.001".to_string()),
            ("--max-steps", "(not given)".to_string()),
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
