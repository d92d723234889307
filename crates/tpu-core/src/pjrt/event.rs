//! PJRT events: completion of transfers and computations.

use pjrt_sys as sys;

use super::ffi::{Api, Padded, pjrt_call};
use crate::error::Result;

/// A future-like PJRT event. Dropping it without waiting is fine.
pub struct Event {
    raw: *mut sys::PJRT_Event,
    api: Api,
}

// SAFETY: PJRT events may be awaited and destroyed from any thread.
unsafe impl Send for Event {}
// SAFETY: as above; `is_ready` is a read-only query.
unsafe impl Sync for Event {}

impl Event {
    /// Takes ownership of `raw`; `None` when the plugin returned no event.
    pub(crate) fn from_raw(api: Api, raw: *mut sys::PJRT_Event) -> Option<Event> {
        (!raw.is_null()).then_some(Event { raw, api })
    }

    /// Blocks until the event fires; returns the error of the work it tracks.
    pub fn wait(self) -> Result<()> {
        let mut args = Padded::<sys::PJRT_Event_Await_Args>::new();
        args.event = self.raw;
        pjrt_call!(self.api, PJRT_Event_Await, &mut args)
    }

    /// True once the tracked work has finished.
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = Padded::<sys::PJRT_Event_IsReady_Args>::new();
        args.event = self.raw;
        pjrt_call!(self.api, PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let mut args = Padded::<sys::PJRT_Event_Destroy_Args>::new();
        args.event = self.raw;
        if let Err(e) = pjrt_call!(self.api, PJRT_Event_Destroy, &mut args) {
            tracing::warn!("destroying a PJRT event failed: {e}");
        }
    }
}
