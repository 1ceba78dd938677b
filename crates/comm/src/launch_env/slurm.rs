//! A job described by SLURM's per-task variables under `srun`.

use super::launch_var::{
    MASTER_ADDR, MASTER_PORT, SLURM_JOB_ID, SLURM_JOB_NODELIST, SLURM_LOCALID, SLURM_NODEID,
    SLURM_NTASKS, SLURM_NTASKS_PER_NODE, SLURM_PROCID, SLURM_STEP_NODELIST,
    SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE,
};
use super::{LaunchEnv, LaunchEnvError, LaunchSource, Vars, check_index, parse_port};
use crate::hostlist::{HostlistError, expand_hostlist, first_host};

/// Base of the port derived from `SLURM_JOB_ID` when `MASTER_PORT` is not
/// set: `20000 + job_id % 10000`. Concurrent jobs sharing a first node get
/// different ports (unless their ids are 10000 apart), without anyone
/// choosing one, and the range stays clear of the ephemeral ports
/// (32768 and up) that outgoing connections use.
pub const SLURM_PORT_BASE: u16 = 20000;
pub(super) const SLURM_PORT_SPAN: u64 = 10000;

/// The rendezvous port a job id derives when `MASTER_PORT` is unset:
/// `SLURM_PORT_BASE + id % SLURM_PORT_SPAN`, below 30000, so always a u16.
pub(super) fn port_of_job(id: u64) -> u16 {
    SLURM_PORT_BASE + (id % SLURM_PORT_SPAN) as u16
}

/// Set for every srun task: a missing variable is missing "because" of it.
const TRIGGER: &str = SLURM_PROCID;

/// Under `srun`: rank 0 runs on the first node of the step (or, outside a
/// step, the job), unless `MASTER_ADDR` names it explicitly.
pub(super) fn resolve(vars: &Vars<'_>) -> Result<LaunchEnv, LaunchEnvError> {
    let rank = vars.number(SLURM_PROCID, TRIGGER)?;
    let world_size = vars.number(SLURM_NTASKS, TRIGGER)?;
    check_index(SLURM_PROCID, rank, SLURM_NTASKS, world_size)?;
    let local_rank = vars.number(SLURM_LOCALID, TRIGGER)?;

    let (nodelist_var, nodelist) = match vars.get(SLURM_STEP_NODELIST) {
        Some(list) => (SLURM_STEP_NODELIST, list),
        None => (
            SLURM_JOB_NODELIST,
            vars.required(SLURM_JOB_NODELIST, TRIGGER)?,
        ),
    };
    let invalid_list = |e: HostlistError| LaunchEnvError::Invalid {
        var: nodelist_var,
        value: nodelist.to_string(),
        reason: e.reason,
    };
    let master_addr = match vars.get(MASTER_ADDR) {
        Some(addr) if !addr.is_empty() => addr.to_string(),
        _ => first_host(nodelist).map_err(invalid_list)?,
    };
    let local_world_size = slurm_local_world_size(vars, world_size, || {
        expand_hostlist(nodelist)
            .map(|hosts| hosts.len())
            .map_err(invalid_list)
    })?;
    check_index(
        SLURM_LOCALID,
        local_rank,
        SLURM_TASKS_PER_NODE,
        local_world_size,
    )?;

    let master_port = match vars.get(MASTER_PORT) {
        Some(port) => parse_port(MASTER_PORT, port)?,
        None => {
            let job_id = vars.get(SLURM_JOB_ID).ok_or(LaunchEnvError::Underivable {
                var: SLURM_JOB_ID,
                why: format!(
                    "neither is {MASTER_PORT}, so this srun task ({TRIGGER} is set) has no \
                     rendezvous port"
                ),
                fix: "set MASTER_PORT to the same free port on every task, or SLURM_JOB_ID to \
                      derive one from (or unset SLURM_PROCID if srun did not start this process)",
            })?;
            let id: u64 = job_id.parse().map_err(|_| LaunchEnvError::Invalid {
                var: SLURM_JOB_ID,
                value: job_id.to_string(),
                reason: "expected a non-negative integer".to_string(),
            })?;
            port_of_job(id)
        }
    };
    Ok(LaunchEnv {
        rank,
        world_size,
        local_rank,
        local_world_size,
        master_addr,
        master_port,
        source: LaunchSource::Slurm,
        agent: None,
        launcher_store: false,
    })
}

/// Tasks on this node: `SLURM_NTASKS_PER_NODE` if the job asked for a fixed
/// number, else this node's entry of `SLURM_STEP_TASKS_PER_NODE` /
/// `SLURM_TASKS_PER_NODE` (format `2(x3),1`, indexed by `SLURM_NODEID`),
/// else an even split of the tasks over the nodes.
fn slurm_local_world_size(
    vars: &Vars<'_>,
    world_size: usize,
    node_count: impl FnOnce() -> Result<usize, LaunchEnvError>,
) -> Result<usize, LaunchEnvError> {
    if let Some(n) = vars.optional_number(SLURM_NTASKS_PER_NODE)? {
        return Ok(n);
    }
    let per_node = [SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE]
        .into_iter()
        .find_map(|var| vars.get(var).map(|v| (var, v)));
    if let Some((var, value)) = per_node {
        let counts = expand_tasks_per_node(var, value)?;
        let node = vars.optional_number(SLURM_NODEID)?;
        return match node {
            Some(node) => counts
                .get(node)
                .copied()
                .ok_or_else(|| LaunchEnvError::Invalid {
                    var: SLURM_NODEID,
                    value: node.to_string(),
                    reason: format!("{var}={value} lists only {} nodes", counts.len()),
                }),
            None if counts.iter().all(|&c| c == counts[0]) => Ok(counts[0]),
            None => Err(LaunchEnvError::Underivable {
                var: SLURM_NODEID,
                why: format!(
                    "{var}={value} gives the nodes different task counts, so this node's count \
                     is not known"
                ),
                fix: "set SLURM_NODEID to this node's index in the node list, or \
                      SLURM_NTASKS_PER_NODE",
            }),
        };
    }
    let nodes = node_count()?;
    if nodes > 0 && world_size.is_multiple_of(nodes) {
        Ok(world_size / nodes)
    } else {
        Err(LaunchEnvError::Underivable {
            var: SLURM_TASKS_PER_NODE,
            why: match nodes {
                0 => "the node list names no node".to_string(),
                _ => format!(
                    "the {world_size} tasks ({SLURM_NTASKS}) do not split evenly over the \
                     {nodes} nodes, so this node's count is not known"
                ),
            },
            fix: "set SLURM_TASKS_PER_NODE (srun sets it) or SLURM_NTASKS_PER_NODE",
        })
    }
}

/// `2(x3),1` → `[2, 2, 2, 1]`.
pub(super) fn expand_tasks_per_node(
    var: &'static str,
    value: &str,
) -> Result<Vec<usize>, LaunchEnvError> {
    let invalid = || LaunchEnvError::Invalid {
        var,
        value: value.to_string(),
        reason: "expected counts like 2(x3),1".to_string(),
    };
    let mut counts = Vec::new();
    for entry in value.split(',') {
        let (count, repeat) = match entry.split_once("(x") {
            Some((count, rest)) => (count, rest.strip_suffix(')').ok_or_else(invalid)?),
            None => (entry, "1"),
        };
        let count: usize = count.parse().map_err(|_| invalid())?;
        let repeat: usize = repeat.parse().map_err(|_| invalid())?;
        if repeat == 0 || repeat > 1 << 20 {
            return Err(invalid());
        }
        counts.extend(std::iter::repeat_n(count, repeat));
    }
    Ok(counts)
}
