//! The flags every rank of a job must give alike.

use super::Cli;

impl Cli {
    /// The flags whose values every rank must share, as `(flag, value)`:
    /// with another `--lr` or `--no-dropout` a rank would train another
    /// model without a word, with other `--epochs`, `--max-steps` or
    /// `--checkpoint-every` it would call collectives the others never
    /// call. Per-rank choices (`--device`, `--threads`, paths, rank 0's
    /// outputs) are not among them.
    pub fn shared_flags(&self) -> Vec<(&'static str, String)> {
        let given = |on: bool| if on { "given" } else { "not given" }.to_string();
        let or_none = |v: Option<String>| v.unwrap_or_else(|| "(not given)".into());
        vec![
            ("--model", format!("{:?}", self.model).to_lowercase()),
            ("--epochs", self.epochs.to_string()),
            ("--batch-size", self.batch_size.to_string()),
            ("--lr", self.lr.to_string()),
            ("--seed", self.seed.to_string()),
            (
                "--max-steps",
                or_none(self.max_steps.map(|n| n.to_string())),
            ),
            ("--no-dropout", given(self.no_dropout)),
            ("--samples", or_none(self.samples.map(|n| n.to_string()))),
            (
                "--embedding-dim",
                or_none(self.embedding_dim.map(|n| n.to_string())),
            ),
            ("--bucket-mb", self.bucket_mb.to_string()),
            (
                "--sparse-grads",
                format!("{:?}", self.sparse_grads).to_lowercase(),
            ),
            ("--sparse-adam", given(self.sparse_adam)),
            ("--backend", format!("{:?}", self.backend).to_lowercase()),
            ("--tf32", given(self.tf32)),
            // Given or not (its path is rank 0's alone): every rank takes
            // part in each save.
            ("--checkpoint-dir", given(self.checkpoint_dir.is_some())),
            (
                "--checkpoint-every",
                or_none(self.checkpoint_every.map(|n| n.to_string())),
            ),
            ("--pipeline-stages", self.pipeline_stages.to_string()),
            ("--micro-batches", self.micro_batches.to_string()),
        ]
    }
}
