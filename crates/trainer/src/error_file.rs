//! torchrun's error file: a worker that fails writes its error where
//! `TORCHELASTIC_ERROR_FILE` says, in the JSON of PyTorch's
//! `torch.distributed.elastic.multiprocessing.errors` (`{"message":
//! {"message": ..., "extraInfo": {"timestamp": ...}}}`), so that
//! torchrun's summary shows the error instead of `error_file: <N/A>`, and
//! names as its "Root Cause" the rank whose failure has the earliest
//! timestamp.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use comm::launch_var::TORCHELASTIC_ERROR_FILE;

/// Writes `message` to torchrun's error file, if torchrun asked for one.
/// A rank that failed only because it lost a peer (`secondary`) dates its
/// error a second later: the timestamps count whole seconds, and the
/// peer's own failure, in the same second, is the root cause.
pub fn record(message: &str, secondary: bool) {
    let Some(path) = std::env::var_os(TORCHELASTIC_ERROR_FILE).filter(|p| !p.is_empty()) else {
        return;
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let text = contents(message, now + u64::from(secondary));
    if let Err(e) = std::fs::write(Path::new(&path), text) {
        tell!(
            "note: could not write torchrun's error file {}: {e}",
            Path::new(&path).display()
        );
    }
}

/// The file's JSON for `message` at `timestamp` (seconds since the epoch,
/// as a string, as PyTorch writes it).
fn contents(message: &str, timestamp: u64) -> String {
    serde_json::json!({
        "message": {
            "message": message,
            "extraInfo": { "timestamp": timestamp.to_string() },
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_message_is_where_torchruns_summary_reads_it() {
        let text = super::contents("rank 1: --resume \"c\": not a checkpoint", 1_700_000_000);
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            json["message"]["message"],
            "rank 1: --resume \"c\": not a checkpoint"
        );
        assert_eq!(json["message"]["extraInfo"]["timestamp"], "1700000000");
    }
}
