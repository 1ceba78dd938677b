//! Who launched this process, and what it said about the job.
//!
//! Resolution order:
//! 1. torchrun-style variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!    `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), as set by
//!    `torchrun` or by hand;
//! 2. SLURM's per-task variables under `srun` (`SLURM_PROCID`,
//!    `SLURM_NTASKS`, `SLURM_LOCALID`, the node list, ...);
//! 3. neither: `None`, and the trainer acts as its own local launcher.
//!
//! The functions work on a plain map so every case is unit-testable without
//! touching the process environment.

use std::collections::HashMap;

use crate::hostlist::first_host;

/// Which launcher described the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchSource {
    Torchrun,
    Slurm,
}

/// The job as a launcher described it to this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world_size: usize,
    /// Rank among the processes on this machine (selects the GPU later).
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub source: LaunchSource,
}

/// A launch variable that is missing or unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchEnvError {
    #[error("{var} is not set, but {because} is set; set {var} as well (or unset {because})")]
    Missing {
        var: &'static str,
        because: &'static str,
    },
    #[error("{var}={value:?} is invalid: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
}

/// Base of the port derived from `SLURM_JOB_ID` when `MASTER_PORT` is not
/// set: `20000 + job_id % 10000`. Concurrent jobs sharing a first node get
/// different ports (unless their ids are 10000 apart), without anyone
/// choosing one, and the range stays clear of the ephemeral ports
/// (32768 and up) that outgoing connections use.
pub const SLURM_PORT_BASE: u16 = 20000;
const SLURM_PORT_SPAN: u64 = 10000;

const TORCHRUN_TRIGGERS: [&str; 4] = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"];

impl LaunchEnv {
    /// Resolves the launch environment of this process.
    pub fn from_process_env() -> Result<Option<LaunchEnv>, LaunchEnvError> {
        let env: HashMap<String, String> = std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
            .collect();
        LaunchEnv::resolve(&env)
    }

    /// Resolves the launch environment described by `env`.
    pub fn resolve(env: &HashMap<String, String>) -> Result<Option<LaunchEnv>, LaunchEnvError> {
        let vars = Vars(env);
        if let Some(trigger) = TORCHRUN_TRIGGERS.into_iter().find(|v| env.contains_key(*v)) {
            return torchrun(&vars, trigger).map(Some);
        }
        if env.contains_key("SLURM_PROCID") {
            return slurm(&vars).map(Some);
        }
        Ok(None)
    }
}

struct Vars<'a>(&'a HashMap<String, String>);

impl Vars<'_> {
    fn get(&self, var: &'static str) -> Option<&str> {
        self.0.get(var).map(|v| v.trim())
    }

    fn required(&self, var: &'static str, because: &'static str) -> Result<&str, LaunchEnvError> {
        self.get(var)
            .ok_or(LaunchEnvError::Missing { var, because })
    }

    fn number(&self, var: &'static str, because: &'static str) -> Result<usize, LaunchEnvError> {
        parse_number(var, self.required(var, because)?)
    }

    fn optional_number(&self, var: &'static str) -> Result<Option<usize>, LaunchEnvError> {
        self.get(var).map(|v| parse_number(var, v)).transpose()
    }
}

fn parse_number(var: &'static str, value: &str) -> Result<usize, LaunchEnvError> {
    value.parse().map_err(|_| LaunchEnvError::Invalid {
        var,
        value: value.to_string(),
        reason: "expected a non-negative integer".to_string(),
    })
}

fn parse_port(var: &'static str, value: &str) -> Result<u16, LaunchEnvError> {
    match value.parse::<u16>() {
        Ok(port) if port > 0 => Ok(port),
        _ => Err(LaunchEnvError::Invalid {
            var,
            value: value.to_string(),
            reason: "expected a TCP port number, 1 to 65535".to_string(),
        }),
    }
}

/// Checks `index < count`, naming both variables.
fn check_index(
    index_var: &'static str,
    index: usize,
    count_var: &'static str,
    count: usize,
) -> Result<(), LaunchEnvError> {
    if count == 0 {
        return Err(LaunchEnvError::Invalid {
            var: count_var,
            value: "0".to_string(),
            reason: "a job needs at least one process".to_string(),
        });
    }
    if index >= count {
        return Err(LaunchEnvError::Invalid {
            var: index_var,
            value: index.to_string(),
            reason: format!("must be less than {count_var}={count}"),
        });
    }
    Ok(())
}

/// torchrun sets all six variables. A job started by hand often sets only
/// `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`; then it is taken
/// to run on one machine (`LOCAL_RANK = RANK`, `LOCAL_WORLD_SIZE =
/// WORLD_SIZE`).
fn torchrun(vars: &Vars<'_>, trigger: &'static str) -> Result<LaunchEnv, LaunchEnvError> {
    let rank = vars.number("RANK", trigger)?;
    let world_size = vars.number("WORLD_SIZE", trigger)?;
    check_index("RANK", rank, "WORLD_SIZE", world_size)?;
    let local_rank = vars.optional_number("LOCAL_RANK")?.unwrap_or(rank);
    let local_world_size = vars
        .optional_number("LOCAL_WORLD_SIZE")?
        .unwrap_or(world_size);
    check_index(
        "LOCAL_RANK",
        local_rank,
        "LOCAL_WORLD_SIZE",
        local_world_size,
    )?;
    let master_addr = vars.required("MASTER_ADDR", trigger)?;
    if master_addr.is_empty() {
        return Err(LaunchEnvError::Invalid {
            var: "MASTER_ADDR",
            value: String::new(),
            reason: "expected the host name or address of rank 0".to_string(),
        });
    }
    let master_port = parse_port("MASTER_PORT", vars.required("MASTER_PORT", trigger)?)?;
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

/// Under `srun`: rank 0 runs on the first node of the step (or, outside a
/// step, the job), unless `MASTER_ADDR` names it explicitly.
fn slurm(vars: &Vars<'_>) -> Result<LaunchEnv, LaunchEnvError> {
    const TRIGGER: &str = "SLURM_PROCID";
    let rank = vars.number("SLURM_PROCID", TRIGGER)?;
    let world_size = vars.number("SLURM_NTASKS", TRIGGER)?;
    check_index("SLURM_PROCID", rank, "SLURM_NTASKS", world_size)?;
    let local_rank = vars.number("SLURM_LOCALID", TRIGGER)?;

    let (nodelist_var, nodelist) = match vars.get("SLURM_STEP_NODELIST") {
        Some(list) => ("SLURM_STEP_NODELIST", list),
        None => (
            "SLURM_JOB_NODELIST",
            vars.required("SLURM_JOB_NODELIST", TRIGGER)?,
        ),
    };
    let invalid_list = |e: crate::hostlist::HostlistError| LaunchEnvError::Invalid {
        var: nodelist_var,
        value: nodelist.to_string(),
        reason: e.reason,
    };
    let master_addr = match vars.get("MASTER_ADDR") {
        Some(addr) if !addr.is_empty() => addr.to_string(),
        _ => first_host(nodelist).map_err(invalid_list)?,
    };
    let local_world_size = slurm_local_world_size(vars, world_size, || {
        crate::hostlist::expand_hostlist(nodelist)
            .map(|hosts| hosts.len())
            .map_err(invalid_list)
    })?;
    check_index(
        "SLURM_LOCALID",
        local_rank,
        "SLURM_TASKS_PER_NODE",
        local_world_size,
    )?;

    let master_port = match vars.get("MASTER_PORT") {
        Some(port) => parse_port("MASTER_PORT", port)?,
        None => {
            let job_id = vars.required("SLURM_JOB_ID", "SLURM_PROCID (and MASTER_PORT is not)")?;
            let id: u64 = job_id.parse().map_err(|_| LaunchEnvError::Invalid {
                var: "SLURM_JOB_ID",
                value: job_id.to_string(),
                reason: "expected a non-negative integer".to_string(),
            })?;
            // Below 30000, so always a valid u16.
            SLURM_PORT_BASE + (id % SLURM_PORT_SPAN) as u16
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
    if let Some(n) = vars.optional_number("SLURM_NTASKS_PER_NODE")? {
        return Ok(n);
    }
    let per_node = ["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"]
        .into_iter()
        .find_map(|var| vars.get(var).map(|v| (var, v)));
    if let Some((var, value)) = per_node {
        let counts = expand_tasks_per_node(var, value)?;
        let node = vars.optional_number("SLURM_NODEID")?;
        return match node {
            Some(node) => counts
                .get(node)
                .copied()
                .ok_or_else(|| LaunchEnvError::Invalid {
                    var: "SLURM_NODEID",
                    value: node.to_string(),
                    reason: format!("{var}={value} lists only {} nodes", counts.len()),
                }),
            None if counts.iter().all(|&c| c == counts[0]) => Ok(counts[0]),
            None => Err(LaunchEnvError::Missing {
                var: "SLURM_NODEID",
                because: "a non-uniform SLURM_TASKS_PER_NODE",
            }),
        };
    }
    let nodes = node_count()?;
    if nodes > 0 && world_size % nodes == 0 {
        Ok(world_size / nodes)
    } else {
        Err(LaunchEnvError::Missing {
            var: "SLURM_TASKS_PER_NODE",
            because: "SLURM_PROCID (and the tasks do not split evenly over the nodes)",
        })
    }
}

/// `2(x3),1` → `[2, 2, 2, 1]`.
fn expand_tasks_per_node(var: &'static str, value: &str) -> Result<Vec<usize>, LaunchEnvError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn resolve(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>, LaunchEnvError> {
        LaunchEnv::resolve(&env(pairs))
    }

    const TORCHRUN: [(&str, &str); 6] = [
        ("RANK", "3"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("LOCAL_WORLD_SIZE", "2"),
        ("MASTER_ADDR", "node01"),
        ("MASTER_PORT", "29500"),
    ];

    const SRUN: [(&str, &str); 6] = [
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "8"),
        ("SLURM_LOCALID", "1"),
        ("SLURM_JOB_NODELIST", "gpu[07-10]"),
        ("SLURM_TASKS_PER_NODE", "2(x4)"),
        ("SLURM_JOB_ID", "123456"),
    ];

    fn with(
        base: &[(&'static str, &'static str)],
        extra: &[(&'static str, &'static str)],
    ) -> Vec<(&'static str, &'static str)> {
        let mut all: Vec<_> = base
            .iter()
            .filter(|(k, _)| !extra.iter().any(|(e, _)| e == k))
            .copied()
            .collect();
        all.extend_from_slice(extra);
        all
    }

    fn without(
        base: &[(&'static str, &'static str)],
        var: &str,
    ) -> Vec<(&'static str, &'static str)> {
        base.iter().filter(|(k, _)| *k != var).copied().collect()
    }

    #[test]
    fn nothing_set_means_local_launch() {
        assert_eq!(
            resolve(&[("PATH", "/bin"), ("MASTER_PORT", "29500")]),
            Ok(None)
        );
    }

    #[test]
    fn torchrun_variables_are_taken_as_is() {
        assert_eq!(
            resolve(&TORCHRUN).unwrap().unwrap(),
            LaunchEnv {
                rank: 3,
                world_size: 8,
                local_rank: 1,
                local_world_size: 2,
                master_addr: "node01".into(),
                master_port: 29500,
                source: LaunchSource::Torchrun,
            }
        );
    }

    #[test]
    fn torchrun_wins_over_slurm() {
        let mut both = TORCHRUN.to_vec();
        both.extend_from_slice(&SRUN);
        assert_eq!(
            resolve(&both).unwrap().unwrap().source,
            LaunchSource::Torchrun
        );
    }

    #[test]
    fn hand_launch_without_local_variables_is_one_machine() {
        let vars = without(&without(&TORCHRUN, "LOCAL_RANK"), "LOCAL_WORLD_SIZE");
        let env = resolve(&vars).unwrap().unwrap();
        assert_eq!((env.local_rank, env.local_world_size), (3, 8));
    }

    #[test]
    fn rank_without_world_size_names_world_size() {
        let err = resolve(&without(&TORCHRUN, "WORLD_SIZE")).unwrap_err();
        assert_eq!(
            err,
            LaunchEnvError::Missing {
                var: "WORLD_SIZE",
                because: "RANK"
            }
        );
        assert!(
            err.to_string()
                .contains("WORLD_SIZE is not set, but RANK is set"),
            "{err}"
        );
    }

    #[test]
    fn world_size_without_rank_names_rank() {
        let err = resolve(&[("WORLD_SIZE", "2")]).unwrap_err();
        assert_eq!(
            err,
            LaunchEnvError::Missing {
                var: "RANK",
                because: "WORLD_SIZE"
            }
        );
    }

    #[test]
    fn missing_master_variables_are_named() {
        let err = resolve(&without(&TORCHRUN, "MASTER_ADDR")).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Missing {
                    var: "MASTER_ADDR",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&without(&TORCHRUN, "MASTER_PORT")).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Missing {
                    var: "MASTER_PORT",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn non_numeric_values_are_named_with_their_value() {
        let err = resolve(&with(&TORCHRUN, &[("RANK", "one")])).unwrap_err();
        assert!(
            err.to_string().starts_with("RANK=\"one\" is invalid"),
            "{err}"
        );
        let err = resolve(&with(&TORCHRUN, &[("MASTER_PORT", "70000")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "MASTER_PORT",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&with(&TORCHRUN, &[("MASTER_PORT", "0")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "MASTER_PORT",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&with(&TORCHRUN, &[("LOCAL_RANK", "-1")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "LOCAL_RANK",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn rank_out_of_range_and_zero_world_are_errors() {
        let err = resolve(&with(&TORCHRUN, &[("RANK", "8")])).unwrap_err();
        assert!(
            err.to_string().contains("must be less than WORLD_SIZE=8"),
            "{err}"
        );
        let err = resolve(&with(&TORCHRUN, &[("WORLD_SIZE", "0")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "WORLD_SIZE",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&with(&TORCHRUN, &[("LOCAL_RANK", "2")])).unwrap_err();
        assert!(
            err.to_string()
                .contains("must be less than LOCAL_WORLD_SIZE=2"),
            "{err}"
        );
    }

    #[test]
    fn srun_task_resolves_master_from_the_node_list() {
        assert_eq!(
            resolve(&SRUN).unwrap().unwrap(),
            LaunchEnv {
                rank: 5,
                world_size: 8,
                local_rank: 1,
                local_world_size: 2,
                master_addr: "gpu07".into(),
                master_port: SLURM_PORT_BASE + 3456,
                source: LaunchSource::Slurm,
            }
        );
    }

    #[test]
    fn step_node_list_wins_over_job_node_list() {
        let env = resolve(&with(&SRUN, &[("SLURM_STEP_NODELIST", "gpu[09-10]")]))
            .unwrap()
            .unwrap();
        assert_eq!(env.master_addr, "gpu09");
    }

    #[test]
    fn explicit_master_variables_override_slurm_defaults() {
        let env = resolve(&with(
            &SRUN,
            &[("MASTER_PORT", "29600"), ("MASTER_ADDR", "10.0.0.1")],
        ))
        .unwrap()
        .unwrap();
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("10.0.0.1", 29600)
        );
        assert_eq!(env.source, LaunchSource::Slurm);
    }

    #[test]
    fn srun_port_needs_job_id_or_master_port() {
        let err = resolve(&without(&SRUN, "SLURM_JOB_ID")).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Missing {
                    var: "SLURM_JOB_ID",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&with(&SRUN, &[("SLURM_JOB_ID", "12a")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "SLURM_JOB_ID",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn srun_missing_or_bad_variables_are_named() {
        for var in ["SLURM_NTASKS", "SLURM_LOCALID", "SLURM_JOB_NODELIST"] {
            let err = resolve(&without(&SRUN, var)).unwrap_err();
            assert_eq!(
                err,
                LaunchEnvError::Missing {
                    var,
                    because: "SLURM_PROCID"
                }
            );
        }
        let err = resolve(&with(&SRUN, &[("SLURM_JOB_NODELIST", "gpu[07-")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "SLURM_JOB_NODELIST",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&with(&SRUN, &[("SLURM_PROCID", "8")])).unwrap_err();
        assert!(
            err.to_string().contains("must be less than SLURM_NTASKS=8"),
            "{err}"
        );
    }

    #[test]
    fn local_world_size_sources_in_order() {
        let fixed = resolve(&with(&SRUN, &[("SLURM_NTASKS_PER_NODE", "4")]))
            .unwrap()
            .unwrap();
        assert_eq!(fixed.local_world_size, 4);

        let uneven = with(
            &SRUN,
            &[
                ("SLURM_TASKS_PER_NODE", "3(x2),1,1"),
                ("SLURM_NODEID", "2"),
                ("SLURM_LOCALID", "0"),
            ],
        );
        assert_eq!(resolve(&uneven).unwrap().unwrap().local_world_size, 1);

        let step = with(&SRUN, &[("SLURM_STEP_TASKS_PER_NODE", "4,4")]);
        assert_eq!(resolve(&step).unwrap().unwrap().local_world_size, 4);

        let even_split = without(&SRUN, "SLURM_TASKS_PER_NODE");
        assert_eq!(resolve(&even_split).unwrap().unwrap().local_world_size, 2);
    }

    #[test]
    fn uneven_tasks_per_node_need_the_node_id() {
        let err = resolve(&with(&SRUN, &[("SLURM_TASKS_PER_NODE", "3,1")])).unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Missing {
                    var: "SLURM_NODEID",
                    ..
                }
            ),
            "{err}"
        );
        let err = resolve(&with(
            &SRUN,
            &[("SLURM_TASKS_PER_NODE", "2(x"), ("SLURM_NODEID", "0")],
        ))
        .unwrap_err();
        assert!(
            matches!(
                err,
                LaunchEnvError::Invalid {
                    var: "SLURM_TASKS_PER_NODE",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn tasks_per_node_expansion() {
        assert_eq!(expand_tasks_per_node("V", "2(x3),1").unwrap(), [2, 2, 2, 1]);
        assert_eq!(expand_tasks_per_node("V", "4").unwrap(), [4]);
        assert!(expand_tasks_per_node("V", "2(x0)").is_err());
        assert!(expand_tasks_per_node("V", "x").is_err());
    }
}
