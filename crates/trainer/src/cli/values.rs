//! Parsers of the numeric flag values clap cannot bound by itself
//! (durations: `launcher::flags::seconds`).

pub(super) fn positive_finite(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(format!("must be a positive finite number, got {s}"))
    }
}
