//! Parsers of the numeric flag values clap cannot bound by itself.

/// The longest `--timeout`, `--grace` or `--progress-seconds`: 30 days,
/// beyond any job's wall-clock limit, and far inside what `Duration` and
/// `Instant` arithmetic can hold.
const MAX_SECONDS: f64 = 30.0 * 24.0 * 3600.0;

/// A duration flag in seconds: positive, finite, at most [`MAX_SECONDS`].
pub(super) fn seconds(s: &str) -> Result<f64, String> {
    let v = positive_finite(s)?;
    if v <= MAX_SECONDS {
        Ok(v)
    } else {
        Err(format!(
            "{s} seconds is more than 30 days ({MAX_SECONDS}), the longest wait this takes"
        ))
    }
}

pub(super) fn positive_finite(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a positive finite number, got {s}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_past_thirty_days_are_refused_before_they_overflow() {
        assert_eq!(seconds("2592000"), Ok(MAX_SECONDS));
        assert_eq!(seconds("0.5"), Ok(0.5));
        for bad in ["2592001", "1e19", "1e300"] {
            let err = seconds(bad).unwrap_err();
            assert!(err.contains("30 days"), "{bad}: {err}");
        }
        for bad in ["0", "-1", "inf", "NaN", "soon"] {
            assert!(seconds(bad).is_err(), "{bad}");
        }
    }
}
