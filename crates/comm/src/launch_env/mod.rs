//! Who launched this process, and what it said about the job.
//!
//! Resolution order:
//! 1. torchrun-style variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//!    `LOCAL_WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`), as set by
//!    `torchrun` or by hand (`torchrun.rs`);
//! 2. an MPI launcher's (`OMPI_COMM_WORLD_*`, `PMI_*`, `PMIX_RANK`), as
//!    `mpirun` sets them (`mpi.rs`); before SLURM's, because an mpirun
//!    inside an sbatch script passes the script's `SLURM_PROCID` on;
//! 3. SLURM's per-task variables under `srun` (`SLURM_PROCID`,
//!    `SLURM_NTASKS`, `SLURM_LOCALID`, the node list, ...) (`slurm.rs`);
//! 4. none: `None`, and the trainer acts as its own local launcher.
//!
//! Every variable name is a constant of [`launch_var`], the one table of them.
//! The functions work on a plain map so every case is unit-testable without
//! touching the process environment.

pub mod launch_var;
mod mpi;
mod slurm;
mod torchrun;

#[cfg(test)]
mod tests;

use std::collections::HashMap;

pub use slurm::SLURM_PORT_BASE;

/// Which launcher described the job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchSource {
    Torchrun,
    Mpi,
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
    /// What torchrun's elastic agent added (`TORCHELASTIC_*`); `None`
    /// without one.
    pub agent: Option<ElasticAgent>,
    /// The trainer's launcher hosts the store (`TRAINER_STORE_HOST`).
    pub launcher_store: bool,
}

/// What torchrun's elastic agent tells its workers beyond their place in
/// the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElasticAgent {
    /// The job's id at torchrun's rendezvous (`TORCHELASTIC_RUN_ID`).
    pub run_id: String,
    /// How often the agent restarted its workers, 0 on the first attempt
    /// (`TORCHELASTIC_RESTART_COUNT`).
    pub restart_count: usize,
    /// Whether the agent hosts a c10d TCPStore at `MASTER_ADDR:MASTER_PORT`
    /// for its workers (`TORCHELASTIC_USE_AGENT_STORE=True`), where rank 0
    /// cannot listen.
    pub hosts_store: bool,
}

impl ElasticAgent {
    /// Where this attempt keeps its keys in the agent's store: torchrun
    /// keeps one store for the whole run, so a restart must not read the
    /// addresses of the attempt before it.
    pub fn key_prefix(&self) -> String {
        format!("trainer/{}/attempt_{}/", self.run_id, self.restart_count)
    }
}

/// A launch variable that is missing or unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchEnvError {
    /// `var` is not set, but `because`, another variable of the same
    /// launcher, is.
    #[error("{var} is not set, but {because} is set; set {var} as well (or unset {because})")]
    Missing {
        var: &'static str,
        because: &'static str,
    },
    /// `var` is not set, and what is set cannot stand in for it: `why`
    /// continues the sentence "`var` is not set, and ...", `fix` says what
    /// to set.
    #[error("{var} is not set, and {why}; {fix}")]
    Underivable {
        var: &'static str,
        why: String,
        fix: &'static str,
    },
    #[error("{var}={value:?} is invalid: {reason}")]
    Invalid {
        var: &'static str,
        value: String,
        reason: String,
    },
}

/// Any of these means "launched by torchrun (or by hand, torchrun-style)";
/// the first one present is named when another is missing.
const TORCHRUN_TRIGGERS: [&str; 4] = [
    launch_var::RANK,
    launch_var::WORLD_SIZE,
    launch_var::LOCAL_RANK,
    launch_var::LOCAL_WORLD_SIZE,
];

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
            return torchrun::resolve(&vars, trigger).map(Some);
        }
        if let Some(trigger) = launch_var::MPI_RANKS
            .into_iter()
            .find(|v| env.contains_key(*v))
        {
            return mpi::resolve(&vars, trigger).map(Some);
        }
        if env.contains_key(launch_var::SLURM_PROCID) {
            return slurm::resolve(&vars).map(Some);
        }
        Ok(None)
    }
}

/// The environment being resolved, read with values trimmed.
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

/// The most processes a job may have: well past today's largest jobs, and
/// a bound on what the store and the ranks allocate per rank (an unchecked
/// `WORLD_SIZE=4294967296` asked for tens of gigabytes).
pub const MAX_WORLD_SIZE: usize = 1 << 20;

/// Checks `index < count <= MAX_WORLD_SIZE`, naming both variables.
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
    if count > MAX_WORLD_SIZE {
        return Err(LaunchEnvError::Invalid {
            var: count_var,
            value: count.to_string(),
            reason: format!("a job has at most {MAX_WORLD_SIZE} processes"),
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
