//! Passing NCCL's unique id from rank 0 to the others through the job's
//! rendezvous store, the way PyTorch passes it through its TCPStore.

use crate::error::CommError;
use crate::store::Store;

/// Bytes in an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// The store key of the unique id of communicator `name` (a job may create
/// several; each needs its own id). Keys under `comm/` belong to this crate.
fn key(name: &str) -> String {
    format!("comm/nccl/{name}/unique-id")
}

/// Rank 0 makes the id with `make` and publishes it; every other rank
/// waits for it (up to the store's timeout) and never calls `make`.
pub fn exchange_unique_id(
    store: &mut Store,
    rank: usize,
    name: &str,
    make: impl FnOnce() -> Result<[u8; UNIQUE_ID_BYTES], CommError>,
) -> Result<[u8; UNIQUE_ID_BYTES], CommError> {
    let key = key(name);
    if rank == 0 {
        let id = make()?;
        store.set(&key, &id)?;
        return Ok(id);
    }
    let value = store.get(&key)?;
    value
        .as_slice()
        .try_into()
        .map_err(|_| CommError::InvalidArgument {
            op: "NCCL unique id exchange",
            reason: format!(
                "store key {key:?} holds {} bytes, not the {UNIQUE_ID_BYTES} of an ncclUniqueId \
                 (is another job using this MASTER_PORT?)",
                value.len()
            ),
        })
}
