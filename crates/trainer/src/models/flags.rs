//! `--model` and each model's own flags; the rule that a model's flags go
//! with it.

use anyhow::{Result, bail};
use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

use super::{MODELS, ModelEntry, cnn, recsys, toy};

/// A model `--model` names: its entry in [`MODELS`].
#[derive(Clone, Copy)]
pub struct ModelKind(&'static dyn ModelEntry);

impl ModelKind {
    /// The entry named `name`, if there is one.
    pub fn named(name: &str) -> Option<Self> {
        MODELS.iter().find(|m| m.name() == name).map(|&m| Self(m))
    }

    pub fn entry(self) -> &'static dyn ModelEntry {
        self.0
    }
}

impl std::fmt::Debug for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.name())
    }
}

impl PartialEq for ModelKind {
    fn eq(&self, other: &Self) -> bool {
        self.0.name() == other.0.name()
    }
}

/// `--model`'s values, from the registry, each with its line of help.
fn model_kinds() -> impl TypedValueParser<Value = ModelKind> {
    let values = MODELS
        .iter()
        .map(|m| PossibleValue::new(m.name()).help(m.about()));
    PossibleValuesParser::new(values)
        .map(|name| ModelKind::named(&name).expect("a possible value names an entry"))
}

/// The model and every model's own flags.
#[derive(Clone, Debug, Args)]
pub struct ModelFlags {
    /// The model to train.
    #[arg(long, default_value = cnn::NAME, value_name = "NAME", value_parser = model_kinds())]
    pub model: ModelKind,

    #[command(flatten)]
    pub cnn: cnn::CnnFlags,

    #[command(flatten)]
    pub toy: toy::ToyFlags,

    #[command(flatten)]
    pub recsys: recsys::RecsysFlags,
}

impl ModelFlags {
    /// Refuses another model's flags, and flags of a capability the model
    /// lacks (`capabilities`: such flags given, as `--sparse-grads`), then
    /// applies the model's own rules.
    pub fn check(&self, capabilities: &[&'static str]) -> Result<()> {
        let chosen = self.model.entry();
        for other in MODELS.iter().filter(|m| m.name() != chosen.name()) {
            if let Some(flag) = other.own_flags_given(self).first() {
                bail!(
                    "{flag} is for --model {}; --model {} does not take it (leave it out)",
                    other.name(),
                    chosen.name()
                );
            }
        }
        for flag in capabilities {
            if !chosen.takes().contains(flag) {
                let takers: Vec<&str> = (MODELS.iter())
                    .filter(|m| m.takes().contains(flag))
                    .map(|m| m.name())
                    .collect();
                bail!(
                    "{flag} means nothing to --model {}: it is for --model {} (leave it out)",
                    chosen.name(),
                    takers.join(" or --model ")
                );
            }
        }
        chosen.check(self)
    }
}
