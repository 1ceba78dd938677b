//! What this machine's launcher runs: its share of the job, and where the
//! job's rendezvous store is. From the flags, or from SLURM under srun with
//! one launcher task per node.

use comm::{LaunchEnv, LaunchSource, launch_var};

use crate::error::LaunchError;
use crate::flags::{DEFAULT_RDZV_PORT, LaunchFlags, NodeCount, RdzvFlags};

/// torchrun's `--master-port` default.
pub const DEFAULT_MASTER_PORT: u16 = 29500;

/// This launcher's part of a job of `nnodes x nproc` ranks (at most: an
/// elastic job runs each attempt on `min_nodes` to `nnodes` machines).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePlan {
    pub nnodes: usize,
    /// The fewest machines the job runs on (`nnodes` but for an elastic
    /// `--nnodes MIN:MAX`).
    pub min_nodes: usize,
    /// `None`: assigned by arrival at the rendezvous.
    pub node_rank: Option<usize>,
    /// Ranks on this machine.
    pub nproc: usize,
    /// Host and port of rank 0's store; `None`: one machine, a free local
    /// port (or `MASTER_PORT`) chosen at each start.
    pub master: Option<(String, u16)>,
}

/// This machine's place in one attempt: node `node_rank` of the `nnodes`
/// machines the attempt runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSlot {
    pub node_rank: usize,
    pub nnodes: usize,
}

impl NodePlan {
    /// The job's world size (its largest, for an elastic job).
    pub fn world_size(&self) -> usize {
        self.nnodes * self.nproc
    }

    /// Whether the machines may change between attempts.
    pub fn is_elastic(&self) -> bool {
        self.min_nodes < self.nnodes
    }

    /// The plan when this process is a launcher: its flags ask for one
    /// (`--world-size N > 1`, `--nproc-per-node`, `--nnodes`,
    /// `--standalone`, `--max-restarts`) and no launcher named its rank,
    /// or srun started it as one task of a node with `--nproc-per-node`.
    /// `None`: this process is a worker. `world_size` is the program's
    /// `--world-size`, which must agree.
    pub fn resolve(
        flags: &LaunchFlags,
        world_size: Option<u32>,
        env: Option<&LaunchEnv>,
    ) -> Result<Option<NodePlan>, LaunchError> {
        match (env, flags.nproc_per_node) {
            (Some(env), Some(nproc)) if env.source == LaunchSource::Slurm => {
                Self::under_srun((flags, nproc as usize), world_size, env).map(Some)
            }
            (Some(env), _) => {
                if let Some(n) = world_size.filter(|&n| n as usize != env.world_size) {
                    refuse!(
                        Flags,
                        "--world-size {n} disagrees with the launcher's world size {} (from the environment)",
                        env.world_size
                    );
                }
                Ok(None)
            }
            (None, _) if flags.any() || world_size.is_some_and(|n| n > 1) => {
                Self::from_flags(flags, world_size).map(Some)
            }
            (None, _) => Ok(None),
        }
    }

    /// The variables worker `local_rank` of the machine in `slot` gets, as
    /// torchrun sets them; `master` is where its rank 0's store listens.
    pub fn worker_env(
        &self,
        slot: NodeSlot,
        local_rank: usize,
        master: &(String, u16),
    ) -> [(&'static str, String); 7] {
        let node_rank = slot.node_rank;
        [
            (
                launch_var::RANK,
                (node_rank * self.nproc + local_rank).to_string(),
            ),
            (
                launch_var::WORLD_SIZE,
                (slot.nnodes * self.nproc).to_string(),
            ),
            (launch_var::LOCAL_RANK, local_rank.to_string()),
            (launch_var::LOCAL_WORLD_SIZE, self.nproc.to_string()),
            (launch_var::GROUP_RANK, node_rank.to_string()),
            (launch_var::MASTER_ADDR, master.0.clone()),
            (launch_var::MASTER_PORT, master.1.to_string()),
        ]
    }

    /// The world size the flags name, if any; they must agree.
    fn requested_world(
        flags: &LaunchFlags,
        world_size: Option<u32>,
    ) -> Result<Option<usize>, LaunchError> {
        let from_nodes = flags
            .nproc_per_node
            .map(|m| m as usize * flags.rdzv.nnodes.unwrap_or(NodeCount::ONE).max as usize);
        match (world_size.map(|n| n as usize), from_nodes) {
            (Some(n), Some(m)) if n != m => {
                refuse!(
                    Flags,
                    "--world-size {n} disagrees with --nnodes x --nproc-per-node = {m}"
                )
            }
            (n, m) => Ok(n.or(m)),
        }
    }

    fn from_flags(flags: &LaunchFlags, world_size: Option<u32>) -> Result<NodePlan, LaunchError> {
        let rdzv = &flags.rdzv;
        let nodes = rdzv.nnodes.unwrap_or(NodeCount::ONE);
        let nnodes = nodes.max as usize;
        let nproc = match (flags.nproc_per_node, world_size) {
            (Some(m), _) => m as usize,
            (None, Some(n)) if nnodes == 1 => n as usize,
            (None, _) if nnodes == 1 => 1,
            (None, _) => {
                refuse!(
                    Flags,
                    "--nnodes {nnodes} needs --nproc-per-node M (ranks on each machine)"
                )
            }
        };
        Self::requested_world(flags, world_size)?;
        if nodes.is_elastic() {
            elastic_refusals(rdzv, nodes, world_size)?;
        }
        if rdzv.standalone && nnodes > 1 {
            refuse!(
                Flags,
                "--standalone is one machine; with --nnodes {nnodes} give --rdzv-endpoint or --master-addr"
            );
        }
        let node_rank = rdzv.node_rank.map(|k| k as usize);
        if let Some(k) = node_rank.filter(|&k| k >= nnodes) {
            refuse!(Flags, "--node-rank {k} must be less than --nnodes {nnodes}");
        }
        let master = master(rdzv)?;
        if nnodes > 1 && master.is_none() {
            refuse!(
                Flags,
                "--nnodes {nnodes} needs the rendezvous: --master-addr HOST (and --master-port) or --rdzv-endpoint HOST:PORT"
            );
        }
        Ok(NodePlan {
            nnodes,
            min_nodes: nodes.min as usize,
            node_rank: node_rank.or((nnodes == 1).then_some(0)),
            nproc,
            master,
        })
    }

    /// One launcher task per node under srun: the node count, this node's
    /// index and the master come from SLURM (its tasks are the nodes).
    fn under_srun(
        (flags, nproc): (&LaunchFlags, usize),
        world_size: Option<u32>,
        env: &LaunchEnv,
    ) -> Result<NodePlan, LaunchError> {
        if env.local_world_size != 1 {
            refuse!(
                Flags,
                "--nproc-per-node under srun needs one task per node (srun --ntasks-per-node 1), but this node runs {} tasks",
                env.local_world_size
            );
        }
        if let Some(n) = flags.rdzv.nnodes.filter(|n| n.is_elastic()) {
            refuse!(
                Flags,
                "--nnodes {n} under srun: SLURM's allocation fixes the machines; for an elastic job start one launcher per machine yourself (each with --nnodes {n} and the same --rdzv-endpoint), or give srun's node count"
            );
        }
        if let Some(n) = flags
            .rdzv
            .nnodes
            .filter(|n| n.max as usize != env.world_size)
        {
            refuse!(
                Flags,
                "--nnodes {n} disagrees with the {} srun tasks (one per node)",
                env.world_size
            );
        }
        let plan = NodePlan {
            nnodes: env.world_size,
            min_nodes: env.world_size,
            node_rank: Some(env.rank),
            nproc,
            master: match master(&flags.rdzv)? {
                Some(m) => Some(m),
                None => Some((env.master_addr.clone(), env.master_port)),
            },
        };
        if let Some(n) = world_size.filter(|&n| n as usize != plan.world_size()) {
            refuse!(
                Flags,
                "--world-size {n} disagrees with {} nodes x --nproc-per-node {nproc}",
                plan.nnodes
            );
        }
        Ok(plan)
    }
}

/// What an elastic `--nnodes MIN:MAX` cannot go with: a node rank (the
/// rendezvous numbers the machines of each attempt) and a fixed world size.
fn elastic_refusals(
    rdzv: &RdzvFlags,
    nodes: NodeCount,
    world_size: Option<u32>,
) -> Result<(), LaunchError> {
    if let Some(k) = rdzv.node_rank {
        refuse!(
            Flags,
            "--node-rank {k} with --nnodes {nodes}: an elastic job numbers its machines afresh at each (re)start, by arrival; leave --node-rank out"
        );
    }
    if let Some(n) = world_size {
        refuse!(
            Flags,
            "--world-size {n} with --nnodes {nodes}: an elastic job's world size is the machines present x --nproc-per-node, set at each (re)start; leave --world-size out"
        );
    }
    Ok(())
}

/// The rendezvous the flags name: `--rdzv-endpoint`, else `--master-addr`
/// and `--master-port`; `None` when they name none.
fn master(flags: &RdzvFlags) -> Result<Option<(String, u16)>, LaunchError> {
    if let Some(endpoint) = &flags.rdzv_endpoint {
        let port = |port: &str| {
            port.parse::<u16>().ok().filter(|&p| p > 0).ok_or_else(|| {
                LaunchError::Flags(format!(
                    "--rdzv-endpoint {endpoint:?}: {port:?} is not a port number"
                ))
            })
        };
        // HOST[:PORT], [IPV6][:PORT], or a bare IPv6 address (colons, no
        // brackets: no port).
        let (host, port) = if let Some(bracketed) = endpoint.strip_prefix('[') {
            let (host, rest) = bracketed.split_once(']').ok_or_else(|| {
                LaunchError::Flags(format!("--rdzv-endpoint {endpoint:?}: no closing `]`"))
            })?;
            match rest.strip_prefix(':') {
                Some(p) => (host, port(p)?),
                None if rest.is_empty() => (host, DEFAULT_RDZV_PORT),
                None => refuse!(
                    Flags,
                    "--rdzv-endpoint {endpoint:?}: {rest:?} after the address"
                ),
            }
        } else {
            match endpoint.rsplit_once(':') {
                Some(_) if endpoint.matches(':').count() > 1 => {
                    (endpoint.as_str(), DEFAULT_RDZV_PORT)
                }
                Some((host, p)) => (host, port(p)?),
                None => (endpoint.as_str(), DEFAULT_RDZV_PORT),
            }
        };
        if host.is_empty() {
            refuse!(Flags, "--rdzv-endpoint {endpoint:?} names no host");
        }
        return Ok(Some((host.to_string(), port)));
    }
    Ok(match (&flags.master_addr, flags.master_port) {
        (Some(addr), port) => Some((addr.clone(), port.unwrap_or(DEFAULT_MASTER_PORT))),
        (None, Some(port)) => Some(("127.0.0.1".to_string(), port)),
        (None, None) => None,
    })
}

#[cfg(test)]
mod tests;
