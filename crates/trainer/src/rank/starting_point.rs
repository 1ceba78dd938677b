//! Rank 0's decision of where training starts (see
//! [`resume::choose`]), after clearing what interrupted saves left in the
//! checkpoint directory.

use anyhow::Context;
use core_tensor::FlatLayout;

use crate::checkpoint::origin::Origin;
use crate::checkpoint::resume::{self, Request};
use crate::checkpoint::{CheckpointDir, CheckpointFlags, Settings};

/// Where rank 0 starts, as `flags` say, in `dir`, for a model of `layout`
/// trained with `settings`.
pub(super) fn choose(
    flags: &CheckpointFlags,
    dir: Option<&CheckpointDir>,
    settings: &Settings,
    layout: &FlatLayout,
) -> anyhow::Result<Origin> {
    let choose = || -> anyhow::Result<Origin> {
        if let Some(dir) = dir {
            for leftover in dir.prepare()? {
                tell!(
                    "note: removed {}, left over from an interrupted save",
                    leftover.display()
                );
            }
        }
        let request = Request {
            resume: flags.resume.as_ref(),
            init_from: flags.init_from.as_deref(),
            dir,
        };
        resume::choose(&request, settings, layout)
    };
    choose().context("rank 0")
}
