//! One safetensors file of f32 tensors: written with its checksum, read back
//! with every check, so a bad file is a one-line error, never garbage.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{Context, anyhow, bail};
use core_tensor::FlatLayout;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};

use super::digest::{self, TensorBytes};
use crate::bounded_read;

/// A tensor to write.
pub(super) struct Named<'a> {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: &'a [f32],
}

/// Serializes `tensors` with `metadata` plus its checksum; returns the
/// file's bytes and the checksum.
pub(super) fn encode(
    tensors: &[Named<'_>],
    mut metadata: HashMap<String, String>,
) -> anyhow::Result<(Vec<u8>, String)> {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| t.values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let covered: BTreeMap<&str, TensorBytes<'_>> = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, data)| {
            (
                t.name.as_str(),
                TensorBytes {
                    shape: &t.shape,
                    data,
                },
            )
        })
        .collect();
    let sum = digest::compute(
        &metadata
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        &covered,
    );
    metadata.insert(digest::KEY.to_string(), sum.clone());
    let views = tensors
        .iter()
        .zip(&bytes)
        .map(|(t, data)| {
            Ok((
                t.name.as_str(),
                TensorView::new(Dtype::F32, t.shape.clone(), data)?,
            ))
        })
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let file = safetensors::serialize(views, Some(metadata))?;
    // The file holds the tensors' bytes now: a model-sized copy less while
    // the header is sorted.
    drop(bytes);
    Ok((with_sorted_header(file)?, sum))
}

/// `file` with its JSON header's keys in sorted order. The safetensors crate
/// writes `__metadata__` from a `HashMap`, whose order changes from run to
/// run; sorted, the same model gives the same bytes, so checkpoints can be
/// compared and hashed as files. Tensors are addressed by their offsets,
/// which do not move. The sorted header is as long as the crate's (the
/// same compact JSON in another order), so it is written over it in place,
/// with no second copy of the file; a header of another length (another
/// crate version's spacing) moves the data once.
fn with_sorted_header(mut file: Vec<u8>) -> anyhow::Result<Vec<u8>> {
    let len_bytes: [u8; 8] = file
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .context("the serialized checkpoint has no header length")?;
    let end = usize::try_from(u64::from_le_bytes(len_bytes))
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&end| end <= file.len())
        .context("the serialized checkpoint's header length is out of range")?;
    let header: BTreeMap<String, serde_json::Value> = serde_json::from_slice(&file[8..end])
        .context("the serialized checkpoint's header is not a JSON object")?;
    let sorted = |v: serde_json::Value| -> anyhow::Result<serde_json::Value> {
        let object: BTreeMap<String, serde_json::Value> = serde_json::from_value(v)?;
        Ok(serde_json::to_value(object)?)
    };
    let header = header
        .into_iter()
        .map(|(k, v)| Ok((k, sorted(v)?)))
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    let mut json = serde_json::to_vec(&header)?;
    // The data that follows starts 8-byte aligned, as the crate lays it out.
    json.resize(json.len().next_multiple_of(8), b' ');
    if 8 + json.len() == end {
        file[8..end].copy_from_slice(&json);
        return Ok(file);
    }
    let mut out = Vec::with_capacity(8 + json.len() + file.len() - end);
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&json);
    out.extend_from_slice(&file[end..]);
    Ok(out)
}

/// Whether a file must carry a checksum: ours always do; PyTorch's never.
#[derive(Clone, Copy)]
pub(super) enum Checksum {
    Required,
    IfPresent,
}

/// A parsed file whose checksum (if any) matched.
pub(super) struct Parsed<'a> {
    file: SafeTensors<'a>,
    pub metadata: HashMap<String, String>,
}

/// Parses a whole file and verifies its checksum.
pub(super) fn parse(bytes: &[u8], checksum: Checksum) -> anyhow::Result<Parsed<'_>> {
    let incomplete =
        |e| anyhow!("not a complete safetensors file ({e}): truncated, or not a checkpoint");
    // `SafeTensors` hides its metadata, so the (small) header is parsed twice.
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(incomplete)?;
    let file = SafeTensors::deserialize(bytes).map_err(incomplete)?;
    let metadata = header.metadata().clone().unwrap_or_default();
    match (metadata.get(digest::KEY), checksum) {
        (None, Checksum::Required) => {
            bail!("no checksum in its metadata: not written by this trainer")
        }
        (None, Checksum::IfPresent) => {}
        (Some(stored), _) => {
            let views: Vec<(String, TensorView<'_>)> = file.tensors();
            let covered = views
                .iter()
                .map(|(n, v)| {
                    (
                        n.as_str(),
                        TensorBytes {
                            shape: v.shape(),
                            data: v.data(),
                        },
                    )
                })
                .collect();
            let computed = digest::compute(
                &metadata
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect(),
                &covered,
            );
            if *stored != computed {
                let short = |h: &str| h.chars().take(12).collect::<String>();
                bail!(
                    "checksum mismatch: the contents are corrupted (stored {}..., computed {}...)",
                    short(stored),
                    short(&computed)
                );
            }
        }
    }
    Ok(Parsed { file, metadata })
}

/// A tensor read whole: its name, shape and values.
pub type Tensor = (String, Vec<usize>, Vec<f32>);

impl Parsed<'_> {
    /// Every tensor, by name; all must be f32.
    pub fn all(&self) -> anyhow::Result<Vec<Tensor>> {
        let mut names = self.file.names();
        names.sort();
        names
            .into_iter()
            .map(|name| {
                let (shape, values) = self.f32_tensor(name)?;
                Ok((name.to_string(), shape, values))
            })
            .collect()
    }

    /// The tensor `name`'s shape and values; it must be there, and f32.
    fn f32_tensor(&self, name: &str) -> anyhow::Result<(Vec<usize>, Vec<f32>)> {
        let view = self
            .file
            .tensor(name)
            .map_err(|_| anyhow!("tensor `{name}` is missing"))?;
        if view.dtype() != Dtype::F32 {
            bail!("`{name}` is {:?}; expected F32", view.dtype());
        }
        let values = (view.data().chunks_exact(4))
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((view.shape().to_vec(), values))
    }

    /// The tensors `expected` (name, shape), in that order: exactly those,
    /// all f32, each of its shape.
    pub fn tensors(&self, expected: &[(String, Vec<usize>)]) -> anyhow::Result<Vec<Vec<f32>>> {
        if let Some(extra) = self
            .file
            .names()
            .into_iter()
            .find(|n| !expected.iter().any(|(e, _)| e == n))
        {
            let names: Vec<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
            let listing = match names.len() {
                0..=8 => names.join(", "),
                n => format!("{n} tensors: {}, ...", names[..3].join(", ")),
            };
            bail!("unexpected tensor `{extra}`; expected {listing}");
        }
        expected
            .iter()
            .map(|(name, shape)| {
                let (found, values) = self.f32_tensor(name)?;
                if found != *shape {
                    bail!("`{name}` has shape {found:?}; this model needs {shape:?}");
                }
                Ok(values)
            })
            .collect()
    }
}

/// The model's parameters as safetensors tensors: `state_dict` names, shapes.
pub(super) fn param_specs(layout: &FlatLayout, prefix: &str) -> Vec<(String, Vec<usize>)> {
    layout
        .views()
        .iter()
        .map(|v| (format!("{prefix}{}", v.spec.name), v.spec.shape.clone()))
        .collect()
}

/// Splits a flat buffer into named tensors to write.
pub(super) fn unflatten<'a>(layout: &FlatLayout, prefix: &str, flat: &'a [f32]) -> Vec<Named<'a>> {
    layout
        .views()
        .iter()
        .map(|v| Named {
            name: format!("{prefix}{}", v.spec.name),
            shape: v.spec.shape.clone(),
            values: &flat[v.range.clone()],
        })
        .collect()
}

/// The largest safetensors file holding `copies` tensors of `layout`'s
/// size: their bytes and a generous header (names, shapes, metadata).
pub fn file_limit(layout: &FlatLayout, copies: u64) -> u64 {
    copies * 4 * layout.len() as u64 + (16 << 20)
}

/// Weights from a safetensors file with PyTorch's `state_dict` names (from
/// `safetensors.torch.save_file(model.state_dict(), path)` or a checkpoint's
/// `model.safetensors`), for a fresh start from them.
pub fn load_weights(path: &Path, layout: &FlatLayout) -> anyhow::Result<Vec<f32>> {
    let bytes = bounded_read::read(path, file_limit(layout, 1), "this model's weights")?;
    let read = || -> anyhow::Result<Vec<f32>> {
        let params = parse(&bytes, Checksum::IfPresent)?
            .tensors(&param_specs(layout, ""))?
            .concat();
        if let Some(view) = layout
            .views()
            .iter()
            .find(|v| params[v.range.clone()].iter().any(|p| !p.is_finite()))
        {
            bail!("`{}` holds non-finite values", view.spec.name);
        }
        Ok(params)
    };
    read().with_context(|| path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(values: &[f32]) -> Vec<u8> {
        let tensors = [
            Named {
                name: "b.weight".into(),
                shape: vec![2, 2],
                values,
            },
            Named {
                name: "a.bias".into(),
                shape: vec![2],
                values: &values[..2],
            },
        ];
        // A fresh HashMap each time: its iteration order is seeded per map.
        let metadata = (0..16)
            .map(|i| (format!("key{i}"), format!("{i}")))
            .collect();
        encode(&tensors, metadata).unwrap().0
    }

    #[test]
    fn the_same_tensors_and_metadata_give_the_same_bytes_and_read_back() {
        let values = [1.0, -2.0, 3.5, 0.25];
        let first = file_of(&values);
        for _ in 0..8 {
            assert_eq!(file_of(&values), first);
        }
        let parsed = parse(&first, Checksum::Required).unwrap();
        assert_eq!(parsed.metadata.len(), 17, "16 keys and the checksum");
        assert_eq!(parsed.metadata["key7"], "7");
        let file = SafeTensors::deserialize(&first).unwrap();
        let weight = file.tensor("b.weight").unwrap();
        assert_eq!(weight.shape(), [2, 2]);
        assert_eq!(weight.data(), values.map(f32::to_le_bytes).concat());
        assert_eq!(file.tensor("a.bias").unwrap().data().len(), 8);
        let header_len = u64::from_le_bytes(first[..8].try_into().unwrap());
        assert_eq!(header_len % 8, 0, "the data stays 8-byte aligned");
    }

    /// The crate's header, sorted, is written over itself: the file is not
    /// copied (its buffer comes back), whatever order the crate chose.
    #[test]
    fn the_header_is_sorted_in_place() {
        let data = [1.0_f32, -2.0, 3.5, 0.25].map(f32::to_le_bytes).concat();
        let tensors = [("b.weight", vec![2, 2]), ("a.bias", vec![4])]
            .map(|(name, shape)| (name, TensorView::new(Dtype::F32, shape, &data).unwrap()));
        let metadata = (0..16)
            .map(|i| (format!("key{i}"), format!("{i}")))
            .collect();
        let file = safetensors::serialize(tensors, Some(metadata)).unwrap();
        let (at, len) = (file.as_ptr(), file.len());
        let sorted = with_sorted_header(file).unwrap();
        assert_eq!(
            (sorted.as_ptr(), sorted.len()),
            (at, len),
            "the file was copied"
        );
        let header = std::str::from_utf8(&sorted[8..])
            .unwrap_or_else(|e| std::str::from_utf8(&sorted[8..8 + e.valid_up_to()]).unwrap());
        let mut keys: Vec<usize> = [
            "__metadata__",
            "key0",
            "key1\"",
            "key10",
            "key9",
            "a.bias",
            "b.weight",
        ]
        .iter()
        .map(|k| header.find(k).unwrap())
        .collect();
        let found = keys.clone();
        keys.sort();
        assert_eq!(found, keys, "not in sorted order: {header}");
        assert_eq!(
            SafeTensors::deserialize(&sorted)
                .unwrap()
                .tensor("a.bias")
                .unwrap()
                .data(),
            data
        );
    }
}
