//! The settings every rank of a job shares (`train::SharedSettings`, a
//! layer above) as a checkpoint records them: one JSON object, a field per
//! flag (`batch_size`: `--batch-size`), so that a resumed run can name
//! each flag it changed, and what differs between two records, in the
//! flags' own words.

use serde_json::{Map, Value};

/// A record: the JSON object `train::SharedSettings` serializes to.
pub type SharedRecord = Map<String, Value>;

/// One setting in which two records differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Difference {
    /// The flag, e.g. `--lr`.
    pub flag: String,
    /// Its value on each side: `0.001`, `given`, `(not given)`.
    pub values: [String; 2],
}

/// The flags whose values differ between `a` and `b`, by name; a field one
/// side lacks (another build's) reads as not given.
pub fn differences(a: &SharedRecord, b: &SharedRecord) -> Vec<Difference> {
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let value = |r: &SharedRecord, k: &String| r.get(k).cloned().unwrap_or(Value::Null);
    (keys.into_iter())
        .map(|k| (k, [value(a, k), value(b, k)]))
        .filter(|(_, [x, y])| x != y)
        .map(|(k, values)| Difference {
            flag: format!("--{}", k.replace('_', "-")),
            values: values.map(|v| shown(&v)),
        })
        .collect()
}

/// A value as a flag gives it: a switch given or not, a number as Rust
/// prints it (`25`, `0.001`), an absent value `(not given)`.
fn shown(value: &Value) -> String {
    match value {
        Value::Null => "(not given)".into(),
        Value::Bool(true) => "given".into(),
        Value::Bool(false) => "not given".into(),
        Value::String(s) => s.clone(),
        Value::Number(n) => match (n.as_u64(), n.as_f64()) {
            (Some(n), _) => n.to_string(),
            (None, Some(x)) => x.to_string(),
            (None, None) => n.to_string(),
        },
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_told_as_flags_and_a_missing_field_as_not_given() {
        let record = |text: &str| match serde_json::from_str(text).unwrap() {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let a =
            record(r#"{"lr":0.001,"bucket_mb":25.0,"no_dropout":false,"max_steps":null,"old":1}"#);
        let b = record(r#"{"lr":0.1,"bucket_mb":25.0,"no_dropout":true,"max_steps":30}"#);
        let told: Vec<String> = (differences(&a, &b).into_iter())
            .map(|d| format!("{} {} / {}", d.flag, d.values[0], d.values[1]))
            .collect();
        assert_eq!(
            told,
            [
                "--lr 0.001 / 0.1",
                "--max-steps (not given) / 30",
                "--no-dropout not given / given",
                "--old 1 / (not given)",
            ]
        );
        assert!(differences(&a, &a).is_empty());
        assert_eq!(shown(&Value::from(25.0)), "25");
    }
}
