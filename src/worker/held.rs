//! The messages this worker holds, by message id, with the newest receipt handle of each; and the ids
//! it recently deleted after a success. SQS (and moto) may hand one message to two parallel receives,
//! or once more after it was deleted: neither copy may start a second handler call.
//!
//! A copy of a message already held adds no lease: its receipt handle (the newest, the one SQS
//! honours for deletes and visibility changes) replaces the held one, and the message is settled
//! once. A copy of a message deleted here after its handler succeeded is deleted again without a
//! call. Ids that ended any other way (retried, released, dead-lettered) are forgotten at once: a
//! message redriven from its DLQ may keep its id and must be handled again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// Successful deletes remembered at most, and for at most this long: a duplicate delivery comes
/// within seconds of the original (a parallel receive, a delete that had not reached SQS yet).
pub const DONE_CAPACITY: usize = 10_000;
pub const DONE_FOR: Duration = Duration::from_mins(15);

/// The receipt handle of one held message; replaced when the same message is received again.
#[derive(Debug)]
pub struct ReceiptHandle(Mutex<String>);

impl ReceiptHandle {
    pub fn new(rh: String) -> Arc<ReceiptHandle> {
        Arc::new(ReceiptHandle(Mutex::new(rh)))
    }

    /// The newest receipt handle.
    pub fn get(&self) -> String {
        self.lock().clone()
    }

    fn set(&self, rh: String) {
        *self.lock() = rh;
    }

    fn lock(&self) -> MutexGuard<'_, String> {
        // A panic while holding this lock cannot leave the String half-written: take it anyway.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a received message is to this worker.
#[derive(Debug)]
pub enum Admission {
    /// Not held: start it, with this handle cell.
    New(Arc<ReceiptHandle>),
    /// Already held by a lease here: the lease now uses this copy's receipt handle; no new lease.
    Held,
    /// Deleted here after a success moments ago: delete this copy too, without a call.
    Done,
}

#[derive(Default)]
struct Inner {
    live: HashMap<String, Arc<ReceiptHandle>>,
    done: HashSet<String>,
    order: VecDeque<(Instant, String)>,
}

/// The registry every lease of one worker shares.
#[derive(Default)]
pub struct Held {
    inner: Mutex<Inner>,
}

impl Held {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits a received message.
    pub fn admit(&self, id: &str, receipt_handle: &str, now: Instant) -> Admission {
        let mut g = self.lock();
        expire(&mut g, now);
        if let Some(cell) = g.live.get(id) {
            cell.set(receipt_handle.to_string());
            return Admission::Held;
        }
        if g.done.contains(id) {
            return Admission::Done;
        }
        let cell = ReceiptHandle::new(receipt_handle.to_string());
        g.live.insert(id.to_string(), cell.clone());
        Admission::New(cell)
    }

    /// The lease of `id` ended without a delete after a success (or is about to make the message
    /// visible again): a later copy is a new delivery.
    pub fn forget(&self, id: &str) {
        self.lock().live.remove(id);
    }

    /// The lease of `id` ended with a delete after its handler succeeded (or its key was done).
    pub fn finished(&self, id: &str, now: Instant) {
        let mut g = self.lock();
        g.live.remove(id);
        if g.done.insert(id.to_string()) {
            g.order.push_back((now, id.to_string()));
        }
        expire(&mut g, now);
    }

    /// Messages held now.
    pub fn len(&self) -> usize {
        self.lock().live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn expire(g: &mut Inner, now: Instant) {
    while let Some((at, _)) = g.order.front() {
        if g.order.len() <= DONE_CAPACITY && now.saturating_duration_since(*at) < DONE_FOR {
            break;
        }
        if let Some((_, id)) = g.order.pop_front() {
            g.done.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_copy_of_a_held_message_takes_over_its_receipt_handle_and_adds_no_lease() {
        let held = Held::default();
        let now = Instant::now();
        let Admission::New(cell) = held.admit("m", "rh-1", now) else {
            panic!("first copy is new")
        };
        assert!(matches!(held.admit("m", "rh-2", now), Admission::Held));
        assert_eq!(cell.get(), "rh-2");
        assert_eq!(held.len(), 1);
        // Retried or released: the next copy is a new delivery.
        held.forget("m");
        assert!(matches!(held.admit("m", "rh-3", now), Admission::New(_)));
    }

    #[test]
    fn a_copy_of_a_message_deleted_after_success_is_done_until_it_is_forgotten_by_age_or_count() {
        let held = Held::default();
        let t0 = Instant::now();
        let Admission::New(_) = held.admit("m", "rh-1", t0) else {
            panic!()
        };
        held.finished("m", t0);
        assert!(held.is_empty());
        assert!(matches!(held.admit("m", "rh-2", t0), Admission::Done));
        assert!(matches!(
            held.admit("m", "rh-3", t0 + DONE_FOR - Duration::from_secs(1)),
            Admission::Done
        ));
        assert!(matches!(
            held.admit("m", "rh-4", t0 + DONE_FOR),
            Admission::New(_)
        ));

        let held = Held::default();
        for i in 0..=DONE_CAPACITY {
            let id = format!("m{i}");
            let _ = held.admit(&id, "rh", t0);
            held.finished(&id, t0);
        }
        assert!(
            matches!(held.admit("m0", "rh", t0), Admission::New(_)),
            "oldest forgotten past the capacity"
        );
        assert!(matches!(
            held.admit(&format!("m{DONE_CAPACITY}"), "rh", t0),
            Admission::Done
        ));
    }
}
