//! Page-locked host buffers: the device copies from and into them by DMA,
//! without the driver's bounce through its own pinned staging memory.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::CudaContext;

use super::launch;

/// A `Vec<f32>` page-locked for as long as it lives (when the system lets
/// it be locked; otherwise it is an ordinary, slower, but correct buffer).
/// Its length never changes, so the locked range stays the vector's.
pub struct PinnedVec {
    data: Vec<f32>,
    locked: bool,
    ctx: Arc<CudaContext>,
}

impl std::fmt::Debug for PinnedVec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedVec")
            .field("len", &self.data.len())
            .field("locked", &self.locked)
            .finish()
    }
}

impl PinnedVec {
    /// `len` zeros, page-locked if the driver agrees (a low `ulimit -l`
    /// may refuse; the copies then go through pageable memory).
    pub(crate) fn zeros(ctx: &Arc<CudaContext>, len: usize) -> Self {
        let mut data = vec![0.0f32; len];
        let locked =
            !data.is_empty() && ctx.bind_to_thread().is_ok() && launch::lock_pages(&mut data);
        Self {
            data,
            locked,
            ctx: ctx.clone(),
        }
    }

    /// Whether the buffer is page-locked.
    pub fn is_locked(&self) -> bool {
        self.locked
    }
}

impl Deref for PinnedVec {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.data
    }
}

impl DerefMut for PinnedVec {
    fn deref_mut(&mut self) -> &mut [f32] {
        &mut self.data
    }
}

impl Drop for PinnedVec {
    fn drop(&mut self) {
        if self.locked && self.ctx.bind_to_thread().is_ok() {
            launch::unlock_pages(&mut self.data);
        }
    }
}
