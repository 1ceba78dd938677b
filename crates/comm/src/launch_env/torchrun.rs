//! A job described torchrun-style.

use super::launch_var::{LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE};
use super::{LaunchEnv, LaunchEnvError, LaunchSource, Vars, check_index, parse_port};

/// torchrun sets all six variables. A job started by hand often sets only
/// `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`; then it is taken
/// to run on one machine (`LOCAL_RANK = RANK`, `LOCAL_WORLD_SIZE =
/// WORLD_SIZE`).
pub(super) fn resolve(vars: &Vars<'_>, trigger: &'static str) -> Result<LaunchEnv, LaunchEnvError> {
    let rank = vars.number(RANK, trigger)?;
    let world_size = vars.number(WORLD_SIZE, trigger)?;
    check_index(RANK, rank, WORLD_SIZE, world_size)?;
    let local_rank = vars.optional_number(LOCAL_RANK)?.unwrap_or(rank);
    let local_world_size = vars
        .optional_number(LOCAL_WORLD_SIZE)?
        .unwrap_or(world_size);
    check_index(LOCAL_RANK, local_rank, LOCAL_WORLD_SIZE, local_world_size)?;
    if local_world_size > world_size {
        return Err(LaunchEnvError::Invalid {
            var: LOCAL_WORLD_SIZE,
            value: local_world_size.to_string(),
            reason: format!(
                "a machine cannot run more ranks than the job's WORLD_SIZE={world_size}"
            ),
        });
    }
    let master_addr = vars.required(MASTER_ADDR, trigger)?;
    if master_addr.is_empty() {
        return Err(LaunchEnvError::Invalid {
            var: MASTER_ADDR,
            value: String::new(),
            reason: "expected the host name or address of rank 0".to_string(),
        });
    }
    let master_port = parse_port(MASTER_PORT, vars.required(MASTER_PORT, trigger)?)?;
    Ok(LaunchEnv {
        rank,
        world_size,
        local_rank,
        local_world_size,
        master_addr: master_addr.to_string(),
        master_port,
        source: LaunchSource::Torchrun,
    })
}
