//! Collective communication for data-parallel training.
//!
//! * [`Communicator`]: the collectives the trainer needs (all-reduce in f32
//!   and f64, broadcast, barrier), implemented by [`TcpCommunicator`] (at
//!   world size 1 every collective is the identity, with no sockets).
//! * [`LocalCommunicator`]: the same trait for ranks that are threads of
//!   one process (no ports), bitwise equal to the TCP ring's results.
//! * [`Rendezvous`] / [`Store`]: rank 0 hosts a small key-value store that
//!   the ranks use to find each other and to check that they agree on the
//!   job (world size, distinct ranks).
//! * [`nccl`]: the same collectives on GPU buffers through NCCL, for one
//!   process per GPU.
//! * [`LaunchEnv`]: what torchrun or SLURM told this process about the job;
//!   [`launch_var`] names the variables, for the launchers that set them.
//! * [`AuthToken`]: the job secret; every store and ring connection starts
//!   with a mutual HMAC challenge-response proving both ends hold it.
//! * [`LiveMember`]: a member of a job whose membership changes (live
//!   recovery): a ring per [`Generation`], formed by node 0's launcher's store.
//! * [`flight`]: every communicator's last collectives, dumped per rank
//!   when it fails or is asked, to name the rank a hung job waits for.
//!
//! Joining is bounded by [`CommConfig::rdzv_timeout`], every other blocking
//! network step by [`CommConfig::timeout`], and every failure is a
//! [`CommError`] that names the rank involved (and a timeout, its flag).
//! A job whose store other machines can reach needs a token, or the
//! user's explicit [`Auth::Open`] (`--no-auth`).

mod auth;
mod communicator;
mod config;
mod deadline;
mod error;
pub mod flight;
#[cfg(test)]
mod fuzz;
mod hostlist;
mod job_auth;
mod launch_env;
mod live;
mod local;
pub mod nccl;
mod nccl_library;
mod rendezvous;
mod store;
mod store_protocol;
mod store_server;
mod tcp;

pub use auth::{AUTH_TOKEN_VAR, AuthFailure, AuthToken, AuthTokenError, HANDSHAKE_TIMEOUT};
pub use communicator::{Communicator, HalfFormat, IntReduce, ReduceOp};
pub use config::{
    CommConfig, DEFAULT_RDZV_TIMEOUT, DEFAULT_TIMEOUT, SameHostTransport, StoreHost,
    is_loopback_host,
};
pub use error::{CommError, Rejection};
pub use hostlist::{HostlistError, expand_hostlist, first_host};
pub use job_auth::{Auth, AuthChoice};
pub use launch_env::{
    ElasticAgent, LaunchEnv, LaunchEnvError, LaunchSource, SLURM_PORT_BASE, launch_var,
};
pub use live::{Enlisted, Generation, LiveMember};
pub use local::LocalCommunicator;
pub use rendezvous::Rendezvous;
pub use store::Store;
pub use store_server::{Seats, StoreServer};
pub use tcp::TcpCommunicator;
