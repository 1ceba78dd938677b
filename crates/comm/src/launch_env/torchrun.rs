//! A job described torchrun-style.

use super::launch_var::{
    LAUNCHER_HOSTS_STORE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RANK,
    TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE,
    TRAINER_STORE_HOST, WORLD_SIZE,
};
use super::{ElasticAgent, LaunchEnv, LaunchEnvError, LaunchSource, Vars, check_index, parse_port};

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
        agent: agent(vars)?,
        launcher_store: launcher_store(vars)?,
    })
}

/// Whether the trainer's launcher hosts the store (`TRAINER_STORE_HOST`).
fn launcher_store(vars: &Vars<'_>) -> Result<bool, LaunchEnvError> {
    match vars.get(TRAINER_STORE_HOST) {
        None => Ok(false),
        Some(LAUNCHER_HOSTS_STORE) => Ok(true),
        Some(other) => Err(LaunchEnvError::Invalid {
            var: TRAINER_STORE_HOST,
            value: other.to_string(),
            reason: format!(
                "expected {LAUNCHER_HOSTS_STORE:?}, which the trainer's launcher sets for its workers (unset it otherwise)"
            ),
        }),
    }
}

/// torchrun's elastic agent, if any of its variables is set. The agent
/// hosts the store when it says `True`, Python's spelling, as PyTorch's
/// own workers read it.
fn agent(vars: &Vars<'_>) -> Result<Option<ElasticAgent>, LaunchEnvError> {
    let vars_of_agent = [
        TORCHELASTIC_RUN_ID,
        TORCHELASTIC_RESTART_COUNT,
        TORCHELASTIC_USE_AGENT_STORE,
    ];
    if vars_of_agent.iter().all(|v| vars.get(v).is_none()) {
        return Ok(None);
    }
    Ok(Some(ElasticAgent {
        run_id: vars.get(TORCHELASTIC_RUN_ID).unwrap_or("").to_string(),
        restart_count: vars
            .optional_number(TORCHELASTIC_RESTART_COUNT)?
            .unwrap_or(0),
        hosts_store: vars.get(TORCHELASTIC_USE_AGENT_STORE) == Some("True"),
    }))
}
