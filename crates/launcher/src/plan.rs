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
mod tests {
    use clap::Parser;

    use super::*;

    /// A program's flags: the launcher's, and its `--world-size`.
    #[derive(Parser)]
    struct Cli {
        #[arg(long)]
        world_size: Option<u32>,
        #[command(flatten)]
        launch: LaunchFlags,
    }

    impl Cli {
        fn resolve(&self, env: Option<&LaunchEnv>) -> Result<Option<NodePlan>, LaunchError> {
            NodePlan::resolve(&self.launch, self.world_size, env)
        }
    }

    /// The plan of these arguments (which must parse).
    fn plan(args: &[&str]) -> Result<Option<NodePlan>, LaunchError> {
        let args = std::iter::once("trainer").chain(args.iter().copied());
        Cli::try_parse_from(args).unwrap().resolve(None)
    }

    #[test]
    fn torchrun_spellings_give_torchrun_ranks() {
        let multi = plan(&[
            "--nnodes=2",
            "--node_rank=1",
            "--nproc_per_node=4",
            "--master_addr=h0",
            "--master_port=1234",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(multi.world_size(), 8);
        let slot = NodeSlot {
            node_rank: 1,
            nnodes: 2,
        };
        let env = multi.worker_env(slot, 2, multi.master.as_ref().unwrap());
        let get = |var| env.iter().find(|(v, _)| *v == var).unwrap().1.as_str();
        assert_eq!(get(launch_var::RANK), "6");
        assert_eq!(get(launch_var::WORLD_SIZE), "8");
        assert_eq!(get(launch_var::LOCAL_RANK), "2");
        assert_eq!(get(launch_var::LOCAL_WORLD_SIZE), "4");
        assert_eq!(get(launch_var::GROUP_RANK), "1");
        assert_eq!(
            (get(launch_var::MASTER_ADDR), get(launch_var::MASTER_PORT)),
            ("h0", "1234")
        );
        let standalone = plan(&["--standalone", "--nproc_per_node=4"])
            .unwrap()
            .unwrap();
        let one_node = plan(&["--world-size", "4"]).unwrap().unwrap();
        assert_eq!(standalone, one_node);
        assert_eq!(
            (one_node.nnodes, one_node.node_rank, one_node.master),
            (1, Some(0), None)
        );
        // The same command on every machine: node ranks by arrival.
        let rdzv = plan(&[
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--rdzv-endpoint",
            "h1",
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (rdzv.node_rank, rdzv.master),
            (None, Some(("h1".to_string(), DEFAULT_RDZV_PORT)))
        );
        assert_eq!(plan(&[]).unwrap(), None);
        let elastic = [
            "--nnodes",
            "1:4",
            "--nproc-per-node",
            "2",
            "--rdzv-endpoint",
            "h1",
        ];
        let elastic = plan(&elastic).unwrap().unwrap();
        assert!(elastic.is_elastic());
        assert_eq!((elastic.min_nodes, elastic.nnodes), (1, 4));
        assert!(plan(&["--max-restarts", "1"]).unwrap().is_some());
        // IPv6, with and without a port.
        for (endpoint, master) in [
            ("[::1]:29411", ("::1", 29411)),
            ("[fe80::2]", ("fe80::2", DEFAULT_RDZV_PORT)),
            ("::1", ("::1", DEFAULT_RDZV_PORT)),
            ("h2:7", ("h2", 7)),
        ] {
            let args = [
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-endpoint",
                endpoint,
            ];
            let got = plan(&args).unwrap().unwrap().master;
            assert_eq!(got, Some((master.0.to_string(), master.1)), "{endpoint}");
        }
    }

    #[test]
    fn inconsistent_node_flags_are_refused_naming_them() {
        for (args, needle) in [
            (
                &["--world-size", "3", "--nproc-per-node", "2"][..],
                "--world-size 3",
            ),
            (
                &["--nnodes", "2", "--nproc-per-node", "2", "--node-rank", "0"],
                "--master-addr",
            ),
            (&["--nnodes", "2", "--master-addr", "h"], "--nproc-per-node"),
            (
                &[
                    "--nnodes",
                    "2",
                    "--nproc-per-node",
                    "1",
                    "--node-rank",
                    "2",
                    "--master-addr",
                    "h",
                ],
                "--node-rank 2",
            ),
            (
                &["--nproc-per-node", "1", "--rdzv-endpoint", "h:x"],
                "not a port",
            ),
            (
                &[
                    "--nnodes",
                    "1:2",
                    "--nproc-per-node",
                    "1",
                    "--node-rank",
                    "0",
                ],
                "an elastic job numbers its machines afresh",
            ),
            (
                &[
                    "--nnodes",
                    "1:2",
                    "--nproc-per-node",
                    "1",
                    "--world-size",
                    "2",
                ],
                "an elastic job's world size",
            ),
        ] {
            let err = plan(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn one_launcher_task_per_node_under_srun_takes_the_nodes_from_slurm() {
        let cli = Cli::try_parse_from(["trainer", "--nproc-per-node", "2"]).unwrap();
        let mut env = LaunchEnv {
            rank: 1,
            world_size: 3,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "n0".to_string(),
            master_port: 20042,
            source: LaunchSource::Slurm,
            agent: None,
        };
        let plan = cli.resolve(Some(&env)).unwrap().unwrap();
        assert_eq!(
            plan,
            NodePlan {
                nnodes: 3,
                min_nodes: 3,
                node_rank: Some(1),
                nproc: 2,
                master: Some(("n0".to_string(), 20042)),
            }
        );
        env.local_world_size = 2;
        let err = cli.resolve(Some(&env)).unwrap_err().to_string();
        assert!(err.contains("one task per node"), "{err}");
        // `srun trainer` in place of `srun torchrun` with its rendezvous flags.
        let seed = Cli::try_parse_from([
            "trainer",
            "--nnodes=3",
            "--nproc_per_node=2",
            "--rdzv_id=42",
            "--rdzv_backend=c10d",
            "--rdzv_endpoint=n0:29500",
        ])
        .unwrap();
        env.local_world_size = 1;
        let plan = seed.resolve(Some(&env)).unwrap().unwrap();
        assert_eq!(plan.master, Some(("n0".to_string(), 29500)));
        assert_eq!((plan.nnodes, plan.node_rank), (3, Some(1)));
        let elastic = Cli::try_parse_from(["trainer", "--nnodes=2:3", "--nproc_per_node=2"]);
        let err = elastic.unwrap().resolve(Some(&env)).unwrap_err();
        assert!(
            err.to_string().contains("SLURM's allocation fixes"),
            "{err}"
        );
        // Without --nproc-per-node an srun task is a worker.
        let worker = Cli::try_parse_from(["trainer"]).unwrap();
        env.local_world_size = 1;
        assert_eq!(worker.resolve(Some(&env)).unwrap(), None);
    }
}
