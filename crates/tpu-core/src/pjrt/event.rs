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

    /// Blocks until the event fires, keeping it (it may be awaited again).
    pub fn wait_ref(&self) -> Result<()> {
        let mut args = Padded::<sys::PJRT_Event_Await_Args>::new();
        args.event = self.raw;
        pjrt_call!(self.api, PJRT_Event_Await, &mut args)
    }

    /// Calls `done` once the tracked work has finished (at once if it has),
    /// on whichever thread completes it, with the work's error if it failed.
    pub fn on_ready(&self, done: impl FnOnce(Result<()>) + Send + 'static) -> Result<()> {
        let callback: Box<OnReady> = Box::new(OnReady {
            api: self.api,
            done: Box::new(done),
        });
        let mut args = Padded::<sys::PJRT_Event_OnReady_Args>::new();
        args.event = self.raw;
        args.callback = Some(fire);
        args.user_arg = Box::into_raw(callback).cast();
        let registered = pjrt_call!(self.api, PJRT_Event_OnReady, &mut args);
        if registered.is_err() {
            // SAFETY: the plugin refused the callback, so it will never call
            // `fire`: the box is still ours to free.
            drop(unsafe { Box::from_raw(args.user_arg.cast::<OnReady>()) });
        }
        registered
    }

    /// True once the tracked work has finished.
    pub fn is_ready(&self) -> Result<bool> {
        let mut args = Padded::<sys::PJRT_Event_IsReady_Args>::new();
        args.event = self.raw;
        pjrt_call!(self.api, PJRT_Event_IsReady, &mut args)?;
        Ok(args.is_ready)
    }
}

/// What [`Event::on_ready`] hands the plugin: the closure and the table
/// that turns its error into ours.
struct OnReady {
    api: Api,
    done: Box<dyn FnOnce(Result<()>) + Send>,
}

/// The plugin's completion callback.
unsafe extern "C" fn fire(error: *mut sys::PJRT_Error, user_arg: *mut std::os::raw::c_void) {
    // SAFETY: `user_arg` is the box `on_ready` leaked; the plugin calls this
    // exactly once, so it is taken back exactly once.
    let callback = unsafe { Box::from_raw(user_arg.cast::<OnReady>()) };
    // The callback owns `error`; `check` frees it.
    let outcome = callback.api.check("PJRT_Event_OnReady", error);
    (callback.done)(outcome);
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
