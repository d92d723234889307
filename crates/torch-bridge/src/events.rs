//! Events on a tpu device (`torch.Event`, `torch.tpu.Event`). A recorded
//! event is the completion of a marking program launched after all work
//! issued so far on its device (devices run programs in launch order), so
//! `query` asks the device without waiting and `synchronize` waits for that
//! work alone. A timing event notes when its mark completed, on the thread
//! that completed it: the time between two is the device's time between
//! them.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use tpu_core::{Event, Runtime};

use crate::error::{BridgeError, Result};

/// How long `elapsed_time` waits for a completed mark's time to be noted.
const NOTE_TIMEOUT: Duration = Duration::from_secs(60);

/// A recorded event.
pub struct DeviceEvent {
    done: Event,
    /// When the mark completed (timing events only).
    finished_at: Option<Arc<(Mutex<Option<Instant>>, Condvar)>>,
}

/// Records an event on `device` after all work issued so far.
pub fn record(device: usize, timing: bool) -> Result<Box<DeviceEvent>> {
    crate::kernels::flush()?;
    let done = Runtime::global()?.mark(device)?;
    let finished_at = timing.then(|| Arc::new((Mutex::new(None), Condvar::new())));
    if let Some(slot) = &finished_at {
        let slot = Arc::clone(slot);
        done.on_ready(move |_| {
            *slot.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
            slot.1.notify_all();
        })?;
    }
    Ok(Box::new(DeviceEvent { done, finished_at }))
}

impl DeviceEvent {
    /// Whether the work before the event has finished, without waiting.
    pub fn query(&self) -> Result<bool> {
        Ok(self.done.is_ready()?)
    }

    /// Waits for the work before the event.
    pub fn wait(&self) -> Result<()> {
        Ok(self.done.wait_ref()?)
    }

    /// Milliseconds from this event's completion to `end`'s, waiting for
    /// both.
    pub fn elapsed_ms(&self, end: &DeviceEvent) -> Result<f64> {
        let (start, end) = (self.finished()?, end.finished()?);
        Ok(if end >= start {
            (end - start).as_secs_f64() * 1e3
        } else {
            -(start - end).as_secs_f64() * 1e3
        })
    }

    fn finished(&self) -> Result<Instant> {
        let slot = self.finished_at.as_ref().ok_or_else(|| {
            BridgeError::Invalid(
                "Both events must be created with argument 'enable_timing=True'.".into(),
            )
        })?;
        self.wait()?;
        let noted = slot.0.lock().unwrap_or_else(|e| e.into_inner());
        let (noted, _) = slot
            .1
            .wait_timeout_while(noted, NOTE_TIMEOUT, |at| at.is_none())
            .unwrap_or_else(|e| e.into_inner());
        noted.ok_or_else(|| {
            BridgeError::Internal(format!(
                "a completed tpu event's time was not noted within {NOTE_TIMEOUT:?}"
            ))
        })
    }
}
