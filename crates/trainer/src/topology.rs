//! Where a rank sits in the job: its rank among all and on its machine,
//! and its place in the grid of pipeline stages by data-parallel replicas.
//! Built once per rank; every other count of ranks is derived from it.
//!
//! Pipeline `p` is ranks `p*S .. p*S + S` (stage = rank mod S), so a
//! pipeline's stages sit on one machine when the ranks per machine are a
//! multiple of `S`; stage `s` of every pipeline forms its data-parallel
//! group (ranks `s, S+s, 2S+s, ...`). Without pipelining (`S` = 1) every
//! rank is a replica of its own.

use anyhow::bail;
use comm::LaunchEnv;

/// This rank's place in the job.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Topology {
    pub rank: usize,
    pub world: usize,
    /// Rank among the processes on this machine: picks the GPU.
    pub local_rank: usize,
    /// Ranks sharing this machine (they share its cores).
    pub local_world: usize,
    /// Pipeline stages; the world is `stages` x data-parallel replicas.
    pub stages: usize,
}

impl Topology {
    /// A job of one rank.
    pub const SINGLE: Self = Self {
        rank: 0,
        world: 1,
        local_rank: 0,
        local_world: 1,
        stages: 1,
    };

    /// Rank `rank` of `world`, `local_rank` of the `local_world` ranks of
    /// its machine, in pipelines of `stages` stages.
    pub fn new(
        (rank, world): (usize, usize),
        (local_rank, local_world): (usize, usize),
        stages: usize,
    ) -> anyhow::Result<Self> {
        if world < stages {
            bail!(
                "--pipeline-stages {stages} needs at least {stages} ranks (--world-size, a multiple of the stages)"
            );
        }
        if stages == 0 || !world.is_multiple_of(stages) {
            bail!(
                "world size {world} is not a multiple of --pipeline-stages {stages}: the world is stages x data-parallel replicas"
            );
        }
        Ok(Self {
            rank,
            world,
            local_rank,
            local_world: local_world.max(1),
            stages,
        })
    }

    /// The rank a launch environment names (`None`: a single process).
    pub fn launched(env: Option<&LaunchEnv>, stages: usize) -> anyhow::Result<Self> {
        match env {
            Some(env) => Self::new(
                (env.rank, env.world_size),
                (env.local_rank, env.local_world_size),
                stages,
            ),
            None => Self::new((0, 1), (0, 1), stages),
        }
    }

    /// This rank's pipeline stage.
    pub fn stage(&self) -> usize {
        self.rank % self.stages
    }

    /// This rank's data-parallel replica: its pipeline.
    pub fn replica(&self) -> usize {
        self.rank / self.stages
    }

    /// Data-parallel replicas: ranks training the same parameters.
    pub fn replicas(&self) -> usize {
        self.world / self.stages
    }

    /// The job ranks of this rank's pipeline, in stage order.
    pub fn pipeline_members(&self) -> Vec<usize> {
        let first = self.replica() * self.stages;
        (first..first + self.stages).collect()
    }

    /// The job ranks of this rank's stage in every pipeline (its
    /// data-parallel group), in replica order.
    pub fn stage_group(&self) -> Vec<usize> {
        (0..self.replicas())
            .map(|r| r * self.stages + self.stage())
            .collect()
    }

    /// Whether this rank counts its samples in the epoch's numbers: the
    /// stages of a pipeline train on the same samples, and only the last
    /// (which has the loss) counts them.
    pub fn counts_samples(&self) -> bool {
        self.stage() + 1 == self.stages
    }

    /// Whether this rank is rank 0, the one that writes files and prints.
    pub fn leads(&self) -> bool {
        self.rank == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_two_by_three_grid_places_every_rank() {
        let at = |rank| Topology::new((rank, 6), (rank % 2, 2), 2).unwrap();
        let t = at(3);
        assert_eq!((t.stage(), t.replica(), t.replicas()), (1, 1, 3));
        assert_eq!(t.pipeline_members(), [2, 3]);
        assert_eq!(t.stage_group(), [1, 3, 5]);
        assert!(t.counts_samples() && !at(2).counts_samples());
        assert!(at(0).leads() && !t.leads());
        let whole = Topology::new((4, 6), (0, 1), 1).unwrap();
        assert_eq!(
            (whole.stage(), whole.replica(), whole.replicas()),
            (0, 4, 6)
        );
        assert_eq!(whole.stage_group(), [0, 1, 2, 3, 4, 5]);
        let err = Topology::new((0, 5), (0, 1), 2).unwrap_err().to_string();
        assert!(
            err.contains("not a multiple of --pipeline-stages 2"),
            "{err}"
        );
    }
}
