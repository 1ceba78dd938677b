//! `Look`: several values read at one instant, in one request.

use super::Shared;
use crate::store_protocol::{MAX_FRAME, Response};

impl Shared {
    /// The values of `keys` as they stand now, read under one lock: a
    /// member that sets one key and then another is never seen with the
    /// second and not the first. `None` when the answer could not travel
    /// (over [`MAX_FRAME`]), measured before anything is copied, so that a
    /// look naming one large value many times costs nothing.
    pub(super) fn look(&self, keys: &[String]) -> Option<Response> {
        let state = self.lock();
        if let Some(r) = &state.rejection {
            return Some(Response::Rejected(r.clone()));
        }
        let found: Vec<Option<&Vec<u8>>> = keys.iter().map(|k| state.values.get(k)).collect();
        // The tag and count, then a mark and a length before each value.
        let size = found
            .iter()
            .flatten()
            .fold(9 + keys.len(), |size, v| size.saturating_add(4 + v.len()));
        (size <= MAX_FRAME)
            .then(|| Response::Values(found.into_iter().map(|v| v.cloned()).collect()))
    }
}
