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
        launcher_store: false,
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
