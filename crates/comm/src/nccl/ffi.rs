//! The NCCL call layer: every `unsafe` of the crate, each block with the
//! reason it is sound. cudarc's safe `Comm` is not used because it can only
//! create blocking communicators (whose initialisation waits forever for a
//! rank that died) and panics when an abort fails; this layer creates
//! non-blocking ones, so every step can be bounded by a deadline and
//! aborted.

use std::ffi::{CStr, c_char, c_int};

use cudarc::driver::CudaStream;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::nccl::sys;

/// A failed NCCL call: the result code and NCCL's own words for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CallError {
    /// `ncclGetErrorString` of the result code.
    pub code: String,
    /// `ncclGetLastError`: what went wrong, as NCCL logged it (may be empty).
    pub detail: String,
    /// The peer's side failed (`ncclRemoteError`): it died or hung up.
    pub remote: bool,
}

/// Whether an NCCL call finished, or goes on in the background (only
/// non-blocking communicators say so).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    Done,
    InProgress,
}

/// One side of a point-to-point exchange: `count` `f32`s at `ptr`, sent to
/// or received from rank `peer`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PeerBuf {
    pub ptr: CUdeviceptr,
    pub count: usize,
    pub peer: usize,
}

/// Whether `libnccl.so` can be loaded (cudarc would panic on first use
/// otherwise).
pub(crate) fn library_present() -> bool {
    // SAFETY: tries `dlopen` on cudarc's list of candidate names and closes
    // what it opened; loading NCCL only runs its (process-safe) initialisers.
    unsafe { sys::is_culib_present() }
}

/// The loaded library's version as `(major, minor, patch)`. Only call after
/// [`library_present`].
pub(crate) fn version() -> Result<(u32, u32, u32), CallError> {
    let mut code: c_int = 0;
    // SAFETY: `ncclGetVersion` writes one int through a valid pointer.
    let result = unsafe { sys::ncclGetVersion(&mut code) };
    check(result, None)?;
    let code = u32::try_from(code).unwrap_or(0);
    // NCCL_VERSION(X,Y,Z) is X*10000 + Y*100 + Z since 2.9, X*1000 + Y*100 + Z before.
    Ok(if code >= 10000 {
        (code / 10000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    })
}

/// A fresh unique id (rank 0 makes it; every rank passes it to [`RawComm::init`]).
pub(crate) fn unique_id() -> Result<[u8; 128], CallError> {
    let mut id = sys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: `ncclGetUniqueId` fills the 128-byte struct it is given.
    let result = unsafe { sys::ncclGetUniqueId(&mut id) };
    check(result, None)?;
    Ok(id.internal.map(|c| c as u8))
}

/// `NCCL_VERSION(major, minor, patch)` of the headers the bindings describe,
/// which is what a `ncclConfig_t` must carry so the library knows its layout.
const BINDINGS_VERSION: u32 = 2 * 10000 + 30 * 100;
/// `NCCL_CONFIG_UNDEF_INT`: "use NCCL's default" for every integer field.
const UNDEF_INT: c_int = c_int::MIN;

/// A communicator handle. The calls this crate makes from a second thread
/// (the watchdog's `ncclCommGetAsyncError` and `ncclCommAbort`) are the ones
/// NCCL documents as safe to make concurrently with others.
#[derive(Debug)]
pub(crate) struct RawComm(sys::ncclComm_t);

// SAFETY: the handle is an opaque pointer NCCL allows to be used from any
// thread; the owner serialises calls other than the thread-safe ones above
// behind a mutex.
unsafe impl Send for RawComm {}

impl RawComm {
    /// Starts creating this rank's communicator, in non-blocking mode: the
    /// call returns at once and [`RawComm::async_error`] reports progress.
    pub(crate) fn init(world_size: usize, id: &[u8; 128], rank: usize) -> Result<Self, CallError> {
        let invalid = |what: &str| CallError {
            code: "invalid argument".into(),
            detail: what.into(),
            remote: false,
        };
        let nranks = c_int::try_from(world_size).map_err(|_| invalid("world size too large"))?;
        let rank = c_int::try_from(rank).map_err(|_| invalid("rank too large"))?;
        let mut config = sys::ncclConfig_t {
            size: size_of::<sys::ncclConfig_t>(),
            magic: 0xcafe_beef,
            version: BINDINGS_VERSION,
            blocking: 0,
            cgaClusterSize: UNDEF_INT,
            minCTAs: UNDEF_INT,
            maxCTAs: UNDEF_INT,
            netName: std::ptr::null(),
            splitShare: UNDEF_INT,
            trafficClass: UNDEF_INT,
            commName: std::ptr::null(),
            collnetEnable: UNDEF_INT,
            CTAPolicy: UNDEF_INT,
            shrinkShare: UNDEF_INT,
            nvlsCTAs: UNDEF_INT,
            nChannelsPerNetPeer: UNDEF_INT,
            nvlinkCentricSched: UNDEF_INT,
            graphUsageMode: UNDEF_INT,
            numRmaCtx: UNDEF_INT,
            maxP2pPeers: UNDEF_INT,
        };
        let id = sys::ncclUniqueId {
            internal: id.map(|b| b as c_char),
        };
        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` and `config` are valid for the call; the config is
        // NCCL_CONFIG_INITIALIZER's layout for the bindings' version (size,
        // magic, version, every other field "undefined") with blocking = 0.
        // NCCL copies the config and id before returning.
        let result =
            unsafe { sys::ncclCommInitRankConfig(&mut comm, nranks, id, rank, &mut config) };
        if comm.is_null() {
            check(result, None)?;
            return Err(invalid("ncclCommInitRankConfig returned no communicator"));
        }
        let raw = RawComm(comm);
        match check(result, Some(&raw)) {
            Ok(_) => Ok(raw),
            Err(e) => {
                raw.abort();
                Err(e)
            }
        }
    }

    /// The communicator's state: `Done` when idle and healthy,
    /// `InProgress` while a non-blocking call still runs, or the
    /// asynchronous error that broke it (a peer's failure, a network error).
    pub(crate) fn async_error(&self) -> Result<Progress, CallError> {
        let mut state = sys::ncclResult_t::ncclSuccess;
        // SAFETY: a live handle and a valid out-pointer; NCCL allows this
        // call concurrently with others on the communicator.
        let result = unsafe { sys::ncclCommGetAsyncError(self.0, &mut state) };
        check(result, Some(self))?;
        check(state, Some(self))
    }

    /// Queues an all-reduce of `count` elements of `dtype` from `send` into
    /// `recv` (the same address for in place) on `stream`.
    ///
    /// # Safety
    /// `send` and `recv` must each address `count` elements of `dtype` of
    /// device memory on the stream's device (the same range or disjoint
    /// ones) that stay allocated, and that no other stream touches, until
    /// the all-reduce has completed on `stream`.
    pub(crate) unsafe fn all_reduce(
        &self,
        (send, recv, count): (CUdeviceptr, CUdeviceptr, usize),
        dtype: sys::ncclDataType_t,
        op: sys::ncclRedOp_t,
        stream: &CudaStream,
    ) -> Result<Progress, CallError> {
        // SAFETY: the caller guarantees the buffers; NCCL allows send =
        // recv; the stream belongs to this rank's device.
        let result = unsafe {
            sys::ncclAllReduce(
                send as *const std::ffi::c_void,
                recv as *mut std::ffi::c_void,
                count,
                dtype,
                op,
                self.0,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        check(result, Some(self))
    }

    /// Queues an in-place broadcast of `count` `f32`s at `ptr` from `root`.
    ///
    /// # Safety
    /// As for [`RawComm::all_reduce`].
    pub(crate) unsafe fn broadcast_f32(
        &self,
        ptr: CUdeviceptr,
        count: usize,
        root: usize,
        stream: &CudaStream,
    ) -> Result<Progress, CallError> {
        let root = c_int::try_from(root).map_err(|_| CallError {
            code: "invalid argument".into(),
            detail: "root too large".into(),
            remote: false,
        })?;
        let buf = ptr as *mut std::ffi::c_void;
        // SAFETY: as for `all_reduce`; NCCL allows send = recv.
        let result = unsafe {
            sys::ncclBroadcast(
                buf,
                buf,
                count,
                sys::ncclDataType_t::ncclFloat32,
                root,
                self.0,
                stream.cu_stream() as sys::cudaStream_t,
            )
        };
        check(result, Some(self))
    }

    /// Queues, as one NCCL group, a send of `send`'s `count` `f32`s to its
    /// peer and a receive into `recv`'s from its peer (either may be
    /// absent) on `stream`.
    ///
    /// # Safety
    /// Each buffer must address `count` `f32`s of device memory on the
    /// stream's device (distinct buffers disjoint) that stay allocated,
    /// and that no other stream touches, until the group has completed on
    /// `stream`.
    pub(crate) unsafe fn send_recv_f32(
        &self,
        send: Option<PeerBuf>,
        recv: Option<PeerBuf>,
        stream: &CudaStream,
    ) -> Result<Progress, CallError> {
        let peer = |buf: &PeerBuf| {
            c_int::try_from(buf.peer).map_err(|_| CallError {
                code: "invalid argument".into(),
                detail: "peer rank too large".into(),
                remote: false,
            })
        };
        let (to, from) = (
            send.as_ref().map(peer).transpose()?,
            recv.as_ref().map(peer).transpose()?,
        );
        let cu_stream = stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: opens a group on this thread; closed below on every path.
        check(unsafe { sys::ncclGroupStart() }, Some(self))?;
        let mut first = Ok(Progress::Done);
        if let (Some(buf), Some(to)) = (&send, to) {
            // SAFETY: the caller guarantees the buffer; the stream belongs
            // to this rank's device.
            first = check(
                unsafe {
                    sys::ncclSend(
                        buf.ptr as *const std::ffi::c_void,
                        buf.count,
                        sys::ncclDataType_t::ncclFloat32,
                        to,
                        self.0,
                        cu_stream,
                    )
                },
                Some(self),
            );
        }
        if let (Some(buf), Some(from), Ok(_)) = (&recv, from, &first) {
            // SAFETY: as for the send.
            first = check(
                unsafe {
                    sys::ncclRecv(
                        buf.ptr as *mut std::ffi::c_void,
                        buf.count,
                        sys::ncclDataType_t::ncclFloat32,
                        from,
                        self.0,
                        cu_stream,
                    )
                },
                Some(self),
            );
        }
        // SAFETY: closes the group opened above.
        let end = check(unsafe { sys::ncclGroupEnd() }, Some(self));
        first.and(end)
    }

    /// Stops every operation of the communicator, wherever it hangs, and
    /// frees it. Callable from any thread, at any time.
    pub(crate) fn abort(self) {
        // SAFETY: a live handle, consumed here so it is never used again.
        // The result is ignored: there is nothing left to do with a
        // communicator whose abort failed, and the rank is failing anyway.
        let _ = unsafe { sys::ncclCommAbort(self.0) };
    }

    /// `ncclGetLastError` for this communicator.
    fn last_error(&self) -> String {
        // SAFETY: a live handle; NCCL returns a NUL-terminated string it
        // owns (possibly empty), which is copied before the next call.
        unsafe { c_string(sys::ncclGetLastError(self.0)) }
    }
}

/// Turns a result code into [`Progress`] or a [`CallError`] with NCCL's
/// messages (from `comm` when there is one).
fn check(result: sys::ncclResult_t, comm: Option<&RawComm>) -> Result<Progress, CallError> {
    match result {
        sys::ncclResult_t::ncclSuccess => Ok(Progress::Done),
        sys::ncclResult_t::ncclInProgress => Ok(Progress::InProgress),
        code => {
            // SAFETY: returns a static NUL-terminated string for any code.
            let text = unsafe { c_string(sys::ncclGetErrorString(code)) };
            let detail = match comm {
                Some(comm) => comm.last_error(),
                // SAFETY: a null communicator asks for the last global error.
                None => unsafe { c_string(sys::ncclGetLastError(std::ptr::null_mut())) },
            };
            Err(CallError {
                code: format!("{code:?}: {text}"),
                detail,
                remote: code == sys::ncclResult_t::ncclRemoteError,
            })
        }
    }
}

/// Copies a C string NCCL returned (null → empty).
///
/// # Safety
/// `ptr` is null or points to a NUL-terminated string valid for the call.
unsafe fn c_string(ptr: *const c_char) -> String {
    if ptr.is_null() {
        return String::new();
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string.
    unsafe { CStr::from_ptr(ptr) }
        .to_string_lossy()
        .into_owned()
}
