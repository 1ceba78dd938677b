//! The communicator of a one-rank job: every collective is the identity, so
//! the trainer runs the same code path at world size 1 without sockets.

use crate::communicator::{Communicator, ReduceOp};
use crate::error::CommError;

/// World size 1: no other ranks, nothing to exchange.
#[derive(Debug, Default, Clone, Copy)]
pub struct SingleProcess;

impl SingleProcess {
    pub fn new() -> Self {
        SingleProcess
    }
}

impl Communicator for SingleProcess {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    /// Sum and average over one rank are the value itself.
    fn all_reduce(&mut self, _buf: &mut [f32], _op: ReduceOp) -> Result<(), CommError> {
        Ok(())
    }

    fn all_reduce_f64(&mut self, _buf: &mut [f64], _op: ReduceOp) -> Result<(), CommError> {
        Ok(())
    }

    /// Only root 0 exists; any other root is the caller's bug, reported
    /// rather than ignored so it surfaces at world size 1 too.
    fn broadcast(&mut self, _buf: &mut [f32], root: usize) -> Result<(), CommError> {
        if root == 0 {
            Ok(())
        } else {
            Err(CommError::InvalidArgument {
                op: "broadcast",
                reason: format!("root {root} is not a rank of a world of size 1"),
            })
        }
    }

    fn barrier(&mut self) -> Result<(), CommError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collectives_leave_data_unchanged() {
        let mut comm: Box<dyn Communicator> = Box::new(SingleProcess::new());
        let mut buf = vec![1.5_f32, -2.0, 3.25];
        comm.all_reduce(&mut buf, ReduceOp::Sum).unwrap();
        comm.all_reduce(&mut buf, ReduceOp::Avg).unwrap();
        comm.broadcast(&mut buf, 0).unwrap();
        comm.barrier().unwrap();
        assert_eq!(buf, [1.5, -2.0, 3.25]);
        let mut metrics = [7.0_f64, 0.5];
        comm.all_reduce_f64(&mut metrics, ReduceOp::Sum).unwrap();
        assert_eq!(metrics, [7.0, 0.5]);
        assert_eq!((comm.rank(), comm.world_size()), (0, 1));
    }

    #[test]
    fn broadcast_from_missing_root_is_an_error() {
        let err = SingleProcess::new().broadcast(&mut [1.0], 1).unwrap_err();
        assert!(err.to_string().contains("root 1"), "{err}");
    }
}
