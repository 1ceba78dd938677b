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

/// `launcher` when the trainer's own launcher (node 0's) hosts the store at
/// `MASTER_ADDR:MASTER_PORT`, as torchrun's agent hosts its own: rank 0
/// then joins it as every rank does, and the store outlives every worker.
pub const TRAINER_STORE_HOST: &str = "TRAINER_STORE_HOST";
/// [`TRAINER_STORE_HOST`]'s one value.
pub const LAUNCHER_HOSTS_STORE: &str = "launcher";

// torchrun's elastic agent, beyond the variables above.
/// `True` when the agent hosts a c10d TCPStore at `MASTER_ADDR:MASTER_PORT`
/// for its workers, who then meet there as its clients.
pub const TORCHELASTIC_USE_AGENT_STORE: &str = "TORCHELASTIC_USE_AGENT_STORE";
/// The job's id at torchrun's rendezvous.
pub const TORCHELASTIC_RUN_ID: &str = "TORCHELASTIC_RUN_ID";
/// How often the agent has restarted its workers: 0 on the first attempt.
pub const TORCHELASTIC_RESTART_COUNT: &str = "TORCHELASTIC_RESTART_COUNT";
/// Where a failing worker writes its error (JSON) for the agent's summary.
pub const TORCHELASTIC_ERROR_FILE: &str = "TORCHELASTIC_ERROR_FILE";

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

// MPI launchers (`mpirun -np N trainer ...`), per process.
/// Open MPI: the process's rank; its presence means "launched by mpirun".
pub const OMPI_COMM_WORLD_RANK: &str = "OMPI_COMM_WORLD_RANK";
/// Open MPI: number of processes.
pub const OMPI_COMM_WORLD_SIZE: &str = "OMPI_COMM_WORLD_SIZE";
/// Open MPI: rank among the processes on this node.
pub const OMPI_COMM_WORLD_LOCAL_RANK: &str = "OMPI_COMM_WORLD_LOCAL_RANK";
/// Open MPI: number of processes on this node.
pub const OMPI_COMM_WORLD_LOCAL_SIZE: &str = "OMPI_COMM_WORLD_LOCAL_SIZE";
/// Open MPI 4: the job's id (the default store port derives from it).
pub const OMPI_MCA_ESS_BASE_JOBID: &str = "OMPI_MCA_ess_base_jobid";
/// MPICH / Intel MPI (Hydra): the process's rank.
pub const PMI_RANK: &str = "PMI_RANK";
/// MPICH / Intel MPI (Hydra): number of processes.
pub const PMI_SIZE: &str = "PMI_SIZE";
/// MPICH / Intel MPI (Hydra): rank on this node.
pub const MPI_LOCALRANKID: &str = "MPI_LOCALRANKID";
/// MPICH / Intel MPI (Hydra): processes on this node.
pub const MPI_LOCALNRANKS: &str = "MPI_LOCALNRANKS";
/// PMIx (Open MPI 5, PRRTE): the process's rank.
pub const PMIX_RANK: &str = "PMIX_RANK";
/// PMIx: the job's namespace (the default store port derives from it).
pub const PMIX_NAMESPACE: &str = "PMIX_NAMESPACE";

/// Any of these means "launched by an MPI launcher".
pub const MPI_RANKS: [&str; 3] = [OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK];
