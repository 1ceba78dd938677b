//! Checking, before training starts, that every rank holds rank 0's
//! values of what a job must share: its [`SharedSettings`] and the
//! training data (each rank reads its own copy; another host's may
//! differ).

use anyhow::{Context, anyhow, bail};
use serde::{Deserialize, Serialize};

use super::shared_settings::SharedSettings;
use crate::comm_thread::CommThread;

/// What rank 0 sends and every rank compares with its own.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
struct Agreement {
    settings: SharedSettings,
    /// The training data, by their size and fingerprint.
    training_data: String,
}

/// Fails on a rank whose settings or data differ from rank 0's, naming the
/// first flag that differs with both values. Every rank calls it (two
/// broadcasts: the length of rank 0's text, then the text).
pub fn check(
    comm: &mut CommThread,
    settings: &SharedSettings,
    training_data: impl std::fmt::Display,
) -> anyhow::Result<()> {
    let rank = comm.rank();
    let mine = Agreement {
        settings: settings.clone(),
        training_data: format!("({training_data})"),
    };
    let text = serde_json::to_string(&mine).context("writing this rank's settings")?;
    let mut len = vec![text.len() as f32];
    comm.broadcast(&mut len, 0)
        .context("receiving rank 0's flags")?;
    let mut root = match len[..] {
        _ if rank == 0 => encode(&text),
        [n] if n.fract() == 0.0 && (0.0..16_777_216.0).contains(&n) => vec![0.0; n as usize],
        _ => bail!("rank 0's flags arrived garbled"),
    };
    comm.broadcast(&mut root, 0)
        .context("receiving rank 0's flags")?;
    let root: Agreement = serde_json::from_str(&decode(&root)?).map_err(|e| {
        anyhow!("rank 0's settings do not read here ({e}): every rank needs the same trainer build")
    })?;
    if let Some(d) = mine.settings.differences(&root.settings).first() {
        let [mine, theirs] = &d.values;
        let flag = &d.flag;
        bail!(
            "rank {rank} has {flag} {mine} but rank 0 has {flag} {theirs}: every rank needs the same flags"
        );
    }
    if mine.training_data != root.training_data {
        bail!(
            "rank {rank} has training data {} but rank 0 has training data {}: every rank needs the same data set (the same files, or --data-dir, on every host)",
            mine.training_data,
            root.training_data
        );
    }
    Ok(())
}

/// A byte per f32 (exact).
fn encode(text: &str) -> Vec<f32> {
    text.bytes().map(f32::from).collect()
}

fn decode(buf: &[f32]) -> anyhow::Result<String> {
    let garbled = || anyhow!("rank 0's flags arrived garbled");
    let bytes = buf
        .iter()
        .map(|&x| (x.fract() == 0.0 && (0.0..256.0).contains(&x)).then_some(x as u8))
        .collect::<Option<Vec<u8>>>()
        .ok_or_else(garbled)?;
    String::from_utf8(bytes).map_err(|_| garbled())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_survives_the_f32_encoding() {
        let text = r#"{"lr":0.001,"max_steps":null} é"#;
        assert_eq!(decode(&encode(text)).unwrap(), text);
        assert!(decode(&[0.5]).is_err());
        assert!(decode(&[300.0]).is_err());
    }
}
