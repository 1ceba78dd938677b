//! A job started by an MPI launcher (`mpirun -np N trainer ...`): Open MPI's
//! `OMPI_COMM_WORLD_*`, MPICH/Intel MPI's `PMI_*` and `MPI_LOCAL*`, or PMIx.

use super::launch_var::{
    MASTER_ADDR, MASTER_PORT, MPI_LOCALNRANKS, MPI_LOCALRANKID, OMPI_COMM_WORLD_LOCAL_RANK,
    OMPI_COMM_WORLD_LOCAL_SIZE, OMPI_COMM_WORLD_SIZE, OMPI_MCA_ESS_BASE_JOBID, PMI_SIZE,
    PMIX_NAMESPACE,
};
use super::slurm::port_of_job;
use super::{LaunchEnv, LaunchEnvError, LaunchSource, Vars, check_index, parse_port};

/// `trigger` is the rank variable found (one of `launch_var::MPI_RANKS`).
/// Without `MASTER_ADDR` all ranks must be on this node (the master is then
/// 127.0.0.1); without `MASTER_PORT` the port is `20000 + h % 10000`, `h` a
/// hash of the job id (`OMPI_MCA_ess_base_jobid`, else `PMIX_NAMESPACE`),
/// which every rank of the job sees alike and concurrent jobs see apart.
pub(super) fn resolve(vars: &Vars<'_>, trigger: &'static str) -> Result<LaunchEnv, LaunchEnvError> {
    let rank = vars.number(trigger, trigger)?;
    let size_var = [OMPI_COMM_WORLD_SIZE, PMI_SIZE]
        .into_iter()
        .find(|v| vars.get(v).is_some())
        .unwrap_or(OMPI_COMM_WORLD_SIZE);
    let world_size = vars.number(size_var, trigger)?;
    check_index(trigger, rank, size_var, world_size)?;
    let first = |names: [&'static str; 2]| -> Result<Option<usize>, LaunchEnvError> {
        for var in names {
            if let Some(n) = vars.optional_number(var)? {
                return Ok(Some(n));
            }
        }
        Ok(None)
    };
    // Without node-local numbers the job is taken to run on one node.
    let local_rank = first([OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID])?.unwrap_or(rank);
    let local_world_size =
        first([OMPI_COMM_WORLD_LOCAL_SIZE, MPI_LOCALNRANKS])?.unwrap_or(world_size);
    check_index(
        OMPI_COMM_WORLD_LOCAL_RANK,
        local_rank,
        OMPI_COMM_WORLD_LOCAL_SIZE,
        local_world_size,
    )?;
    let master_addr = match vars.get(MASTER_ADDR) {
        Some(addr) if !addr.is_empty() => addr.to_string(),
        _ if local_world_size == world_size => "127.0.0.1".to_string(),
        _ => {
            return Err(LaunchEnvError::Underivable {
                var: MASTER_ADDR,
                why: format!(
                    "the MPI launcher placed the {world_size} ranks on several nodes \
                     ({local_world_size} on this one), so which host runs rank 0 is not known"
                ),
                fix: "set MASTER_ADDR to the host of rank 0, the same on every rank",
            });
        }
    };
    let master_port = match vars.get(MASTER_PORT) {
        Some(port) => parse_port(MASTER_PORT, port)?,
        None => {
            let job = [OMPI_MCA_ESS_BASE_JOBID, PMIX_NAMESPACE]
                .into_iter()
                .find_map(|v| vars.get(v))
                .ok_or_else(|| LaunchEnvError::Underivable {
                    var: MASTER_PORT,
                    why: format!(
                        "the MPI launcher ({trigger} is set) names no job id to derive it from \
                         (neither {OMPI_MCA_ESS_BASE_JOBID} nor {PMIX_NAMESPACE} is set)"
                    ),
                    fix: "set MASTER_PORT to the same free port on every rank",
                })?;
            port_of_job(fnv1a(job))
        }
    };
    Ok(LaunchEnv {
        rank,
        world_size,
        local_rank,
        local_world_size,
        master_addr,
        master_port,
        source: LaunchSource::Mpi,
        agent: None,
        launcher_store: false,
    })
}

/// FNV-1a: a fixed hash, the same in every process and every release.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::super::launch_var::SLURM_PROCID;
    use super::super::slurm::SLURM_PORT_BASE;
    use super::*;

    fn resolve(pairs: &[(&str, &str)]) -> Result<Option<LaunchEnv>, LaunchEnvError> {
        let env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::resolve(&env)
    }

    /// What Debian's Open MPI 4.1 sets for rank 1 of `mpirun -np 2`.
    const OPEN_MPI: [(&str, &str); 6] = [
        ("OMPI_COMM_WORLD_RANK", "1"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ("OMPI_MCA_ess_base_jobid", "14745601"),
        ("PMIX_RANK", "1"),
    ];

    #[test]
    fn open_mpi_on_one_node_meets_on_loopback_at_a_port_of_the_job() {
        let env = resolve(&OPEN_MPI).unwrap().unwrap();
        assert_eq!(
            (
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size
            ),
            (1, 2, 1, 2)
        );
        assert_eq!(env.source, LaunchSource::Mpi);
        assert_eq!(env.master_addr, "127.0.0.1");
        assert!((20000..30000).contains(&env.master_port));
        // Pinned: every rank and every release derive the same port.
        assert_eq!(
            env.master_port,
            SLURM_PORT_BASE + (fnv1a("14745601") % 10000) as u16
        );
        let mut other_job = OPEN_MPI;
        other_job[4].1 = "14745602";
        assert_ne!(
            resolve(&other_job).unwrap().unwrap().master_port,
            env.master_port
        );
        // An mpirun inside an sbatch script: the MPI variables win.
        let mut in_sbatch = OPEN_MPI.to_vec();
        in_sbatch.push((SLURM_PROCID, "0"));
        assert_eq!(resolve(&in_sbatch).unwrap().unwrap(), env);
    }

    #[test]
    fn mpich_pmi_and_explicit_masters() {
        let env = resolve(&[
            ("PMI_RANK", "3"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "1"),
            ("MPI_LOCALNRANKS", "2"),
            ("MASTER_ADDR", "n0"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (
                env.rank,
                env.world_size,
                env.local_rank,
                env.local_world_size
            ),
            (3, 4, 1, 2)
        );
        assert_eq!((env.master_addr.as_str(), env.master_port), ("n0", 29500));
    }

    #[test]
    fn what_mpi_cannot_tell_is_asked_for_by_name() {
        let several_nodes = [
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_MCA_ess_base_jobid", "1"),
        ];
        let missing = |pairs: &[(&str, &str)]| match resolve(pairs) {
            Err(LaunchEnvError::Missing { var, .. } | LaunchEnvError::Underivable { var, .. }) => {
                var
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(missing(&several_nodes), MASTER_ADDR);
        assert_eq!(missing(&[("PMIX_RANK", "0")]), OMPI_COMM_WORLD_SIZE);
        assert_eq!(
            missing(&[("PMI_RANK", "0"), ("PMI_SIZE", "1")]),
            MASTER_PORT
        );
        assert!(matches!(
            resolve(&[("PMI_RANK", "2"), ("PMI_SIZE", "2")]),
            Err(LaunchEnvError::Invalid {
                var: "PMI_RANK",
                ..
            })
        ));
    }
}
