use super::slurm::expand_tasks_per_node;
use super::*;
use crate::config::{CommConfig, StoreHost};

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

fn without(base: &[(&'static str, &'static str)], var: &str) -> Vec<(&'static str, &'static str)> {
    base.iter().filter(|(k, _)| *k != var).copied().collect()
}

/// The variable an error blames, and how.
#[derive(Debug, PartialEq)]
enum Blame {
    Missing(&'static str),
    Invalid(&'static str),
}

/// Checks that `resolved` failed blaming `expected`.
#[track_caller]
fn expect_blame(resolved: Result<Option<LaunchEnv>, LaunchEnvError>, expected: Blame) {
    let err = resolved.unwrap_err();
    let blame = match &err {
        LaunchEnvError::Missing { var, .. } | LaunchEnvError::Underivable { var, .. } => {
            Blame::Missing(var)
        }
        LaunchEnvError::Invalid { var, .. } => Blame::Invalid(var),
    };
    assert_eq!(blame, expected, "{err}");
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
            agent: None,
            launcher_store: false,
        }
    );
}

#[test]
fn the_trainers_launcher_says_it_hosts_the_store() {
    let store = |value| {
        let env = resolve(&with(&TORCHRUN, &[("TRAINER_STORE_HOST", value)]));
        env.map(|e| e.unwrap().launcher_store)
    };
    assert_eq!(store("launcher"), Ok(true));
    assert!(!resolve(&TORCHRUN).unwrap().unwrap().launcher_store);
    let err = store("rank0").unwrap_err().to_string();
    assert!(
        err.contains("TRAINER_STORE_HOST") && err.contains("\"launcher\""),
        "{err}"
    );
    let config = CommConfig::from_launch_env(
        &resolve(&with(&TORCHRUN, &[("TRAINER_STORE_HOST", "launcher")]))
            .unwrap()
            .unwrap(),
    );
    assert_eq!(config.store, StoreHost::Launcher);
}

#[test]
fn torchruns_agent_says_whether_it_hosts_the_store_and_which_attempt_this_is() {
    let agent = |extra: &[(&'static str, &'static str)]| {
        resolve(&with(&TORCHRUN, extra)).unwrap().unwrap().agent
    };
    assert_eq!(agent(&[]), None);
    let restarted = agent(&[
        ("TORCHELASTIC_RUN_ID", "job7"),
        ("TORCHELASTIC_RESTART_COUNT", "2"),
        ("TORCHELASTIC_USE_AGENT_STORE", "True"),
    ])
    .unwrap();
    assert_eq!(
        restarted,
        ElasticAgent {
            run_id: "job7".into(),
            restart_count: 2,
            hosts_store: true,
        }
    );
    assert_eq!(restarted.key_prefix(), "trainer/job7/attempt_2/");
    // PyTorch's workers read anything but Python's `True` as no agent store.
    let own = agent(&[("TORCHELASTIC_USE_AGENT_STORE", "False")]).unwrap();
    assert!(!own.hosts_store && own.restart_count == 0);
    expect_blame(
        resolve(&with(&TORCHRUN, &[("TORCHELASTIC_RESTART_COUNT", "-1")])),
        Blame::Invalid("TORCHELASTIC_RESTART_COUNT"),
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
    expect_blame(
        resolve(&without(&TORCHRUN, "MASTER_ADDR")),
        Blame::Missing("MASTER_ADDR"),
    );
    expect_blame(
        resolve(&without(&TORCHRUN, "MASTER_PORT")),
        Blame::Missing("MASTER_PORT"),
    );
}

#[test]
fn non_numeric_values_are_named_with_their_value() {
    let err = resolve(&with(&TORCHRUN, &[("RANK", "one")])).unwrap_err();
    assert!(
        err.to_string().starts_with("RANK=\"one\" is invalid"),
        "{err}"
    );
    expect_blame(
        resolve(&with(&TORCHRUN, &[("MASTER_PORT", "70000")])),
        Blame::Invalid("MASTER_PORT"),
    );
    expect_blame(
        resolve(&with(&TORCHRUN, &[("MASTER_PORT", "0")])),
        Blame::Invalid("MASTER_PORT"),
    );
    expect_blame(
        resolve(&with(&TORCHRUN, &[("LOCAL_RANK", "-1")])),
        Blame::Invalid("LOCAL_RANK"),
    );
}

#[test]
fn rank_out_of_range_and_zero_world_are_errors() {
    let err = resolve(&with(&TORCHRUN, &[("RANK", "8")])).unwrap_err();
    assert!(
        err.to_string().contains("must be less than WORLD_SIZE=8"),
        "{err}"
    );
    expect_blame(
        resolve(&with(&TORCHRUN, &[("WORLD_SIZE", "0")])),
        Blame::Invalid("WORLD_SIZE"),
    );
    let err = resolve(&with(&TORCHRUN, &[("LOCAL_RANK", "2")])).unwrap_err();
    assert!(
        err.to_string()
            .contains("must be less than LOCAL_WORLD_SIZE=2"),
        "{err}"
    );
}

#[test]
fn sizes_past_what_a_job_can_be_are_errors() {
    let err = resolve(&with(&TORCHRUN, &[("WORLD_SIZE", "4294967296")])).unwrap_err();
    assert!(
        err.to_string().contains("at most 1048576 processes"),
        "{err}"
    );
    expect_blame(
        resolve(&with(&TORCHRUN, &[("LOCAL_WORLD_SIZE", "9")])),
        Blame::Invalid("LOCAL_WORLD_SIZE"),
    );
    let one = [
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("LOCAL_WORLD_SIZE", "8"),
        ("MASTER_ADDR", "a"),
        ("MASTER_PORT", "1"),
    ];
    let err = resolve(&one).unwrap_err();
    assert!(
        err.to_string()
            .contains("more ranks than the job's WORLD_SIZE=1"),
        "{err}"
    );
    let env = with(&TORCHRUN, &[("WORLD_SIZE", "1048576")]);
    assert_eq!(resolve(&env).unwrap().unwrap().world_size, 1 << 20);
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
            agent: None,
            launcher_store: false,
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
    expect_blame(
        resolve(&without(&SRUN, "SLURM_JOB_ID")),
        Blame::Missing("SLURM_JOB_ID"),
    );
    expect_blame(
        resolve(&with(&SRUN, &[("SLURM_JOB_ID", "12a")])),
        Blame::Invalid("SLURM_JOB_ID"),
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
    expect_blame(
        resolve(&with(&SRUN, &[("SLURM_JOB_NODELIST", "gpu[07-")])),
        Blame::Invalid("SLURM_JOB_NODELIST"),
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
    expect_blame(
        resolve(&with(&SRUN, &[("SLURM_TASKS_PER_NODE", "3,1")])),
        Blame::Missing("SLURM_NODEID"),
    );
    expect_blame(
        resolve(&with(
            &SRUN,
            &[("SLURM_TASKS_PER_NODE", "2(x"), ("SLURM_NODEID", "0")],
        )),
        Blame::Invalid("SLURM_TASKS_PER_NODE"),
    );
}

#[test]
fn tasks_per_node_expansion() {
    assert_eq!(expand_tasks_per_node("V", "2(x3),1").unwrap(), [2, 2, 2, 1]);
    assert_eq!(expand_tasks_per_node("V", "4").unwrap(), [4]);
    assert!(expand_tasks_per_node("V", "2(x0)").is_err());
    assert!(expand_tasks_per_node("V", "x").is_err());
}

#[test]
fn what_cannot_be_derived_is_explained_in_whole_sentences() {
    let message = |pairs: &[(&str, &str)]| resolve(pairs).unwrap_err().to_string();
    assert_eq!(
        message(&without(&SRUN, "SLURM_JOB_ID")),
        "SLURM_JOB_ID is not set, and neither is MASTER_PORT, so this srun task (SLURM_PROCID is \
         set) has no rendezvous port; set MASTER_PORT to the same free port on every task, or \
         SLURM_JOB_ID to derive one from (or unset SLURM_PROCID if srun did not start this process)"
    );
    assert_eq!(
        message(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]),
        "MASTER_PORT is not set, and the MPI launcher (PMI_RANK is set) names no job id to derive \
         it from (neither OMPI_MCA_ess_base_jobid nor PMIX_NAMESPACE is set); set MASTER_PORT to \
         the same free port on every rank"
    );
    assert_eq!(
        message(&[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]),
        "MASTER_ADDR is not set, and the MPI launcher placed the 4 ranks on several nodes (2 on \
         this one), so which host runs rank 0 is not known; set MASTER_ADDR to the host of rank \
         0, the same on every rank"
    );
    assert_eq!(
        message(&with(&SRUN, &[("SLURM_TASKS_PER_NODE", "3,1")])),
        "SLURM_NODEID is not set, and SLURM_TASKS_PER_NODE=3,1 gives the nodes different task \
         counts, so this node's count is not known; set SLURM_NODEID to this node's index in the \
         node list, or SLURM_NTASKS_PER_NODE"
    );
    assert_eq!(
        message(&with(
            &without(&SRUN, "SLURM_TASKS_PER_NODE"),
            &[("SLURM_NTASKS", "7")]
        )),
        "SLURM_TASKS_PER_NODE is not set, and the 7 tasks (SLURM_NTASKS) do not split evenly \
         over the 4 nodes, so this node's count is not known; set SLURM_TASKS_PER_NODE (srun \
         sets it) or SLURM_NTASKS_PER_NODE"
    );
}
