//! The launch environment variables, as one table: comm reads them, the
//! trainer's local launcher sets the torchrun ones for its workers, and
//! tests set or clear them. Nobody spells them as strings.

// torchrun (and any launcher that imitates it, such as the trainer's own).
/// This process's rank, `0..WORLD_SIZE`.
pub const RANK: &str = "RANK";
/// Number of processes in the job.
pub const WORLD_SIZE: &str = "WORLD_SIZE";
/// Rank among the processes on this machine (selects the GPU).
pub const LOCAL_RANK: &str = "LOCAL_RANK";
/// Number of processes on this machine.
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
/// Host name or address of rank 0, which hosts the rendezvous store.
pub const MASTER_ADDR: &str = "MASTER_ADDR";
/// Port of the rendezvous store.
pub const MASTER_PORT: &str = "MASTER_PORT";

/// The index of this process's machine (its launcher's node rank).
pub const GROUP_RANK: &str = "GROUP_RANK";

/// Every variable torchrun sets for a worker.
pub const TORCHRUN: [&str; 7] = [
    RANK,
    WORLD_SIZE,
    LOCAL_RANK,
    LOCAL_WORLD_SIZE,
    GROUP_RANK,
    MASTER_ADDR,
    MASTER_PORT,
];

// SLURM, per task under `srun`.
/// The task's rank; its presence means "launched by srun".
pub const SLURM_PROCID: &str = "SLURM_PROCID";
/// Number of tasks in the step.
pub const SLURM_NTASKS: &str = "SLURM_NTASKS";
/// The task's rank on its node.
pub const SLURM_LOCALID: &str = "SLURM_LOCALID";
/// The node's index in the node list.
pub const SLURM_NODEID: &str = "SLURM_NODEID";
/// The job's id (the default store port derives from it).
pub const SLURM_JOB_ID: &str = "SLURM_JOB_ID";
/// The job's nodes, compressed (`gpu[07-10]`).
pub const SLURM_JOB_NODELIST: &str = "SLURM_JOB_NODELIST";
/// The step's nodes; wins over the job's.
pub const SLURM_STEP_NODELIST: &str = "SLURM_STEP_NODELIST";
/// Tasks per node when the job asked for a fixed number.
pub const SLURM_NTASKS_PER_NODE: &str = "SLURM_NTASKS_PER_NODE";
/// The job's tasks per node, compressed (`2(x3),1`).
pub const SLURM_TASKS_PER_NODE: &str = "SLURM_TASKS_PER_NODE";
/// The step's tasks per node; wins over the job's.
pub const SLURM_STEP_TASKS_PER_NODE: &str = "SLURM_STEP_TASKS_PER_NODE";

/// Prefix of every SLURM variable, for clearing a job's identity from an
/// environment (a child that must not think it runs under srun).
pub const SLURM_PREFIX: &str = "SLURM_";
