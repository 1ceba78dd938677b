//! Host buffers that report an allocation the machine refuses as
//! [`Error::OutOfMemory`] instead of aborting the process: `vec![0; n]`
//! and `to_vec` call the allocation-failure handler, which prints
//! "memory allocation of N bytes failed" and aborts (a stack trace, exit
//! 134), where a batch too large for an address-space or memory limit
//! should end in an error that names the buffer and the fix.

use std::alloc::Layout;

use super::Elem;
use crate::{Error, Result};

/// A buffer of `len` zeros. Zeroed pages come from the system untouched
/// (as `vec![0; len]`'s do): they take memory only as they are written.
pub(crate) fn zeroed<T: Elem>(len: usize) -> Result<Vec<T>> {
    let refused = || out_of_host_memory::<T>(len);
    let layout = Layout::array::<T>(len).map_err(|_| refused())?;
    if layout.size() == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: `layout` has a non-zero size (checked above), as
    // `alloc_zeroed` requires.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(refused());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of
    // `len` `T`s (`Layout::array`: the size and alignment a `Vec<T>` of
    // capacity `len` uses), and its `len` elements are zero bytes, a valid
    // `T` (`Elem` requires `ValidAsZeroBits`). The Vec owns and frees it.
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

/// A copy of `host`.
pub(crate) fn copied<T: Elem>(host: &[T]) -> Result<Vec<T>> {
    let mut copy = Vec::new();
    (copy.try_reserve_exact(host.len())).map_err(|_| out_of_host_memory::<T>(host.len()))?;
    copy.extend_from_slice(host);
    Ok(copy)
}

fn out_of_host_memory<T>(len: usize) -> Error {
    Error::OutOfMemory {
        device: "the host".into(),
        bytes: (len as u64).saturating_mul(size_of::<T>() as u64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_the_host_cannot_hold_are_an_error_not_an_abort() {
        assert_eq!(zeroed::<f32>(3).unwrap(), [0.0; 3]);
        assert!(zeroed::<u8>(0).unwrap().is_empty());
        assert_eq!(copied(&[1u32, 2]).unwrap(), [1, 2]);
        // More than any address space holds.
        let err = zeroed::<f32>(usize::MAX / 8).unwrap_err();
        assert!(
            matches!(&err, Error::OutOfMemory { device, bytes }
                if device == "the host" && *bytes == (usize::MAX / 8) as u64 * 4),
            "{err}"
        );
        let err = zeroed::<u8>(1 << 62).unwrap_err();
        assert!(err.to_string().starts_with("out of memory: "), "{err}");
    }
}
