//! Each rank's count of collectives entered, published to the store in
//! the background so a failed collective can name who never arrived
//! without a store round trip on the fast path.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use tpu_core::{Error, Result};

use crate::store::Store;

/// How often a changed count is published.
pub(crate) const INTERVAL: Duration = Duration::from_millis(50);

/// The store key of rank `rank`'s count (under the group's prefix).
pub(crate) fn key(rank: usize) -> String {
    format!("progress/{rank}")
}

/// A published count.
pub(crate) fn decode(value: &[u8]) -> u64 {
    value.try_into().map(u64::from_le_bytes).unwrap_or_default()
}

/// This rank's count and the thread publishing it.
pub(crate) struct Progress {
    shared: Arc<Shared>,
}

struct Shared {
    entered: AtomicU64,
    stop: AtomicBool,
}

impl Progress {
    /// Publishes 0 now and every change from here on, over `store`.
    pub(crate) fn start(store: Store, prefix: &str, rank: usize) -> Result<Progress> {
        let key = format!("{prefix}{}", key(rank));
        store.set(&key, &0u64.to_le_bytes())?;
        let shared = Arc::new(Shared {
            entered: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let publishing = shared.clone();
        thread::Builder::new()
            .name("tpu-dist-progress".into())
            .spawn(move || publish(&store, &key, &publishing))
            .map_err(|e| Error::Rendezvous {
                address: String::new(),
                reason: format!("cannot start the progress thread: {e}"),
            })?;
        Ok(Progress { shared })
    }

    /// Records that this rank has entered `count` collectives.
    pub(crate) fn entered(&self, count: u64) {
        self.shared.entered.store(count, Ordering::Relaxed);
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

fn publish(store: &Store, key: &str, shared: &Shared) {
    let mut published = 0;
    while !shared.stop.load(Ordering::Relaxed) {
        thread::sleep(INTERVAL);
        let now = shared.entered.load(Ordering::Relaxed);
        if now != published {
            if store.set(key, &now.to_le_bytes()).is_err() {
                return; // the store is gone; the next collective will say so
            }
            published = now;
        }
    }
}
