//! Whether a host-memory backend's buffers fit in the machine, checked when
//! new ones were made and before training writes to them.

use anyhow::bail;
use core_tensor::Backend;

use crate::monitor::procfs;

/// The buffers `make` makes for a training (`train`) or test batch of
/// `n` (once per batch size), refused when the machine cannot hold them.
pub(crate) fn checked_buffers<B: Backend, T>(
    backend: &B,
    (n, train): (usize, bool),
    make: impl FnOnce() -> core_tensor::Result<T>,
) -> anyhow::Result<T> {
    let buffers = make()?;
    if train {
        check_host_room(
            backend,
            &format!("a training batch of {n}"),
            "lower --batch-size",
        )?;
    } else {
        check_host_room(
            backend,
            &format!("a test batch of {n}"),
            "run fewer ranks on this machine",
        )?;
    }
    Ok(buffers)
}

/// Fails when `backend` has handed out more bytes than this process holds
/// plus what the machine can still give: zeroed buffers take memory only
/// as they are first written, so without this check a batch too large for
/// the machine ran until the kernel's out-of-memory killer ended it with
/// no message. `what` names the buffers (for the message); their owner
/// says how to need less.
fn check_host_room<B: Backend>(backend: &B, what: &str, fix: &str) -> anyhow::Result<()> {
    let (Some(allocated), Some(room)) = (backend.allocated_host_bytes(), host_room_bytes()) else {
        return Ok(());
    };
    match shortfall(allocated, room) {
        Some([need, have]) => bail!(
            "{what} would take {need:.1} GiB of memory in all, but this machine has {have:.1} GiB for this rank (free, and what it holds already): {fix}"
        ),
        None => Ok(()),
    }
}

/// The most memory this process can hold, in bytes: what it holds already
/// plus what the machine can still give, and no more than its address-space
/// limit (`ulimit -v`, past which an allocation aborts the process);
/// `None` where the machine does not say.
pub(crate) fn host_room_bytes() -> Option<u64> {
    let room = procfs::available_bytes()? + (procfs::resident_mib()? * 1024.0 * 1024.0) as u64;
    Some(procfs::address_space_limit_bytes().map_or(room, |limit| room.min(limit)))
}

/// `[allocated, room]` in GiB when `allocated` bytes do not fit in `room`.
fn shortfall(allocated: u64, room: u64) -> Option<[f64; 2]> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    (allocated > room).then(|| [gib(allocated), gib(room)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use core_tensor::Cpu;

    #[test]
    fn buffers_past_the_room_are_a_shortfall() {
        assert_eq!(shortfall(3 << 30, 2 << 30), Some([3.0, 2.0]));
        assert_eq!(shortfall(2 << 30, 2 << 30), None);
        // The CPU backend counts what it hands out, touched or not.
        let cpu = Cpu::new(1).unwrap();
        let before = cpu.allocated_host_bytes().unwrap();
        let _zeros = cpu.zeros::<f32>(1000).unwrap();
        let _copy = cpu.upload(&[0u32; 10]).unwrap();
        assert_eq!(cpu.allocated_host_bytes(), Some(before + 4040));
        check_host_room(&cpu, "a few bytes", "none needed").unwrap();
        assert!(host_room_bytes().unwrap() > 1 << 20);
    }
}
