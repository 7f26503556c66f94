//! One way to take a std `Mutex` across the crate: a lock poisoned by a panicking holder is taken
//! anyway. The state behind these locks (caches, counters, sample windows, running redrives) changes
//! by single inserts, removes and pushes, so a panic elsewhere cannot leave it half-written, and a
//! reconcile or a scrape must not fail because some other task panicked.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// The guard of `m`, poisoned or not.
pub fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
