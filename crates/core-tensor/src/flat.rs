//! One contiguous buffer for all parameters (and one for all gradients), with
//! named views into it, so that collectives and the optimizer run over a
//! single slice and checkpoints keep PyTorch's `state_dict` names.

use std::ops::Range;

use crate::{Error, Result};

/// A named parameter tensor and its shape, e.g. `conv1.weight [32, 1, 3, 3]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

impl ParamSpec {
    pub fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        Self {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Where one parameter lives in the flat buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamView {
    pub spec: ParamSpec,
    pub range: Range<usize>,
}

/// The layout of a flat parameter buffer: parameters packed in declaration
/// order with no gaps (the order of PyTorch's `state_dict`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlatLayout {
    views: Vec<ParamView>,
    len: usize,
}

impl FlatLayout {
    /// Packs `specs` in order. Names must be unique.
    pub fn new(specs: Vec<ParamSpec>) -> Result<Self> {
        let mut views = Vec::with_capacity(specs.len());
        let mut offset = 0;
        for spec in specs {
            if views.iter().any(|v: &ParamView| v.spec.name == spec.name) {
                return Err(Error::InvalidArgument {
                    op: "FlatLayout::new",
                    reason: format!("parameter name `{}` appears twice", spec.name),
                });
            }
            let range = offset..offset + spec.numel();
            offset = range.end;
            views.push(ParamView { spec, range });
        }
        Ok(Self { views, len: offset })
    }

    /// The total number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The parameters in buffer order.
    pub fn views(&self) -> &[ParamView] {
        &self.views
    }

    /// The view of parameter `name`, if any.
    pub fn get(&self, name: &str) -> Option<&ParamView> {
        self.views.iter().find(|v| v.spec.name == name)
    }

    /// The range of parameter `name`; an error naming it when absent.
    pub fn range(&self, name: &str) -> Result<Range<usize>> {
        self.get(name)
            .map(|v| v.range.clone())
            .ok_or_else(|| Error::InvalidArgument {
                op: "FlatLayout::range",
                reason: format!("no parameter named `{name}`"),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_in_order_without_gaps() {
        let layout = FlatLayout::new(vec![
            ParamSpec::new("a", &[2, 3]),
            ParamSpec::new("b", &[4]),
        ])
        .unwrap();
        assert_eq!(layout.len(), 10);
        assert_eq!(layout.range("a").unwrap(), 0..6);
        assert_eq!(layout.range("b").unwrap(), 6..10);
        assert!(layout.range("c").is_err());
    }

    #[test]
    fn duplicate_names_are_rejected() {
        let err = FlatLayout::new(vec![ParamSpec::new("a", &[1]), ParamSpec::new("a", &[1])])
            .unwrap_err();
        assert!(err.to_string().contains("`a` appears twice"), "{err}");
    }
}
