//! The TCP ring's side of the benchmark: host buffers, synchronous calls.

use anyhow::Result;
use comm::{Communicator, ReduceOp, TcpCommunicator};

use crate::{Collective, fill_value};

pub struct TcpRank {
    comm: TcpCommunicator,
    input: Vec<f32>,
    output: Vec<f32>,
    work: Vec<f32>,
}

impl TcpRank {
    pub fn new(comm: TcpCommunicator) -> Self {
        Self {
            comm,
            input: Vec::new(),
            output: Vec::new(),
            work: Vec::new(),
        }
    }
}

impl Collective for TcpRank {
    fn prepare(&mut self, count: usize) -> Result<()> {
        let rank = self.comm.rank();
        self.input = (0..count).map(|i| fill_value(rank, i)).collect();
        self.output = vec![0.0; count];
        self.work = vec![0.0; count];
        Ok(())
    }

    /// The ring reduces in place; out of place is a copy into the output
    /// first (part of the measured time, as the input must survive).
    fn run(&mut self, in_place: bool) -> Result<()> {
        if in_place {
            self.comm.all_reduce(&mut self.work, ReduceOp::Sum)?;
        } else {
            self.output.copy_from_slice(&self.input);
            self.comm.all_reduce(&mut self.output, ReduceOp::Sum)?;
        }
        Ok(())
    }

    fn wait(&mut self) -> Result<()> {
        Ok(())
    }

    fn reset_work(&mut self) -> Result<()> {
        self.work.copy_from_slice(&self.input);
        Ok(())
    }

    fn result(&mut self, in_place: bool) -> Result<Vec<f32>> {
        Ok(if in_place { &self.work } else { &self.output }.clone())
    }

    fn control(&mut self) -> &mut dyn Communicator {
        &mut self.comm
    }
}
