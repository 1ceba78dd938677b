//! `--comm-hook powersgd`'s state in a checkpoint: a third file,
//! `powersgd.safetensors`, beside the two every checkpoint has, written
//! only by runs that have compressed a step. It holds each compressed
//! parameter's `Q` (`q.<name>`, `cols × rank`: the same on every rank) and
//! every rank's error feedback (`error`, `world × parameters`: each rank's
//! own), so a resumed run continues PowerSGD bit for bit. The state file
//! records its checksum, tying the three together.

use std::collections::HashMap;

use anyhow::{Context, bail};

use super::files::{self, Checksum, Named};

pub const HOOK_FILE: &str = "powersgd.safetensors";
/// The state file's metadata key of the hook file's checksum.
pub(super) const HOOK_SUM: &str = "powersgd_sha256";
const Q: &str = "q.";
const ERROR: &str = "error";

/// PowerSGD's state (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct HookState {
    /// Each compressed parameter's `Q`, by name: `[cols, rank]`, row-major.
    pub q: Vec<(String, [usize; 2], Vec<f32>)>,
    /// Every rank's error feedback over the whole model, rank after rank.
    pub errors: Vec<f32>,
}

impl HookState {
    /// The file's bytes and checksum, for `world` ranks.
    pub(super) fn encode(&self, world: usize) -> anyhow::Result<(Vec<u8>, String)> {
        let mut tensors: Vec<Named<'_>> = (self.q.iter())
            .map(|(name, shape, values)| Named {
                name: format!("{Q}{name}"),
                shape: shape.to_vec(),
                values,
            })
            .collect();
        tensors.push(Named {
            name: ERROR.to_string(),
            shape: vec![world, self.errors.len() / world.max(1)],
            values: &self.errors,
        });
        files::encode(&tensors, HashMap::new())
    }

    /// Reads the file's `bytes`, which must have checksum `sum`, for
    /// `world` ranks of `params` parameters.
    pub(super) fn decode(
        bytes: &[u8],
        sum: &str,
        (world, params): (usize, usize),
    ) -> anyhow::Result<Self> {
        let file = files::parse(bytes, Checksum::Required)?;
        if file.metadata.get(super::digest::KEY).map(String::as_str) != Some(sum) {
            bail!("it is not the one the state file was written with (their checksums differ)");
        }
        let mut state = HookState {
            q: Vec::new(),
            errors: Vec::new(),
        };
        for (name, shape, values) in file.all()? {
            match (name.strip_prefix(Q), &shape[..]) {
                (Some(param), &[cols, rank]) => {
                    state.q.push((param.to_string(), [cols, rank], values))
                }
                (None, &[w, n]) if name == ERROR && (w, n) == (world, params) => {
                    state.errors = values
                }
                _ if name == ERROR => bail!(
                    "`{ERROR}` has shape {shape:?}; the checkpoint's {world} ranks of this model's {params} parameters need [{world}, {params}]"
                ),
                _ => bail!("unexpected tensor `{name}` of shape {shape:?}"),
            }
        }
        if state.errors.is_empty() {
            bail!("tensor `{ERROR}` is missing");
        }
        if let Some((name, ..)) = state
            .q
            .iter()
            .find(|(_, _, v)| v.iter().any(|x| !x.is_finite()))
        {
            bail!("`{Q}{name}` holds non-finite values; no run writes such a checkpoint");
        }
        Ok(state)
    }

    /// Whether every value is finite (a run never saves a NaN).
    pub(super) fn is_finite(&self) -> bool {
        let finite = |v: &[f32]| v.iter().all(|x| x.is_finite());
        finite(&self.errors) && self.q.iter().all(|(_, _, v)| finite(v))
    }
}

/// The largest hook file of `world` ranks' errors over `params`
/// parameters (the `Q`s are far smaller than one copy of them).
pub(super) fn file_limit(world: usize, params: usize) -> u64 {
    4 * (world as u64 + 1) * params as u64 + (16 << 20)
}

/// Reads `dir`'s hook file, checked against `sum`.
pub(super) fn load(
    dir: &std::path::Path,
    sum: &str,
    shape: (usize, usize),
) -> anyhow::Result<HookState> {
    let bytes = crate::bounded_read::read(
        &dir.join(HOOK_FILE),
        file_limit(shape.0, shape.1),
        "PowerSGD's state",
    )
    .with_context(|| format!("reading {HOOK_FILE}"))?;
    HookState::decode(&bytes, sum, shape).context(HOOK_FILE)
}
