//! Reconcile slots shared fairly between namespaces: at most `capacity` reconciles run at once, and
//! when all are taken the waiting ones get the slots freed in turn by namespace (round-robin, first
//! come first served within one; `aws::limit::FairQueue`). kube's own scheduler would hand them out in
//! the order the reconciles fell due, so a namespace with a thousand QueueConsumers at a 1 s poll would
//! hold every slot and another namespace's poll would wait behind all of them.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::aws::limit::FairQueue;
use crate::sync::lock;

struct State {
    capacity: usize,
    running: usize,
    waiting: FairQueue<oneshot::Sender<Slot>>,
}

/// The pool of reconcile slots.
pub struct Slots {
    state: Mutex<State>,
}

/// A running reconcile's slot; dropping it hands the slot to the next waiter in turn.
pub struct Slot(Option<Arc<Slots>>);

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(pool) = self.0.take() {
            Slots::release(&pool);
        }
    }
}

impl Slots {
    pub fn new(capacity: usize) -> Arc<Slots> {
        Arc::new(Slots {
            state: Mutex::new(State {
                capacity: capacity.max(1),
                running: 0,
                waiting: FairQueue::default(),
            }),
        })
    }

    /// Sets how many reconciles run at once (`run --reconcile-concurrency` per controller).
    pub fn set_capacity(&self, capacity: usize) {
        lock(&self.state).capacity = capacity.max(1);
    }

    /// Reconciles running and waiting now.
    pub fn load(&self) -> (usize, usize) {
        let s = lock(&self.state);
        (s.running, s.waiting.len())
    }

    /// Waits for a slot in `namespace`'s turn.
    pub async fn acquire(self: &Arc<Self>, namespace: &str) -> Slot {
        let rx = {
            let mut s = lock(&self.state);
            if s.running < s.capacity && s.waiting.is_empty() {
                s.running += 1;
                return Slot(Some(self.clone()));
            }
            let (tx, rx) = oneshot::channel();
            s.waiting.push(namespace, tx);
            rx
        };
        // Dropped unanswered (cannot happen while the pool lives): run without waiting longer.
        if let Ok(slot) = rx.await {
            return slot;
        }
        lock(&self.state).running += 1;
        Slot(Some(self.clone()))
    }

    /// A slot is free: to the next waiter still waiting (a slot sent to one that has gone comes back
    /// here when the channel drops it), else back to the pool.
    fn release(this: &Arc<Slots>) {
        let mut s = lock(&this.state);
        if s.running <= s.capacity {
            while let Some((_, tx)) = s.waiting.pop() {
                if tx.is_closed() {
                    continue;
                }
                // Moved to the waiter still counted as running; a send that fails returns it here.
                match tx.send(Slot(Some(this.clone()))) {
                    Ok(()) => return,
                    // Still ours: no release of its own.
                    Err(mut slot) => slot.0 = None,
                }
            }
        }
        s.running = s.running.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn freed_slots_go_to_the_namespaces_in_turn() {
        let slots = Slots::new(2);
        let held = [slots.acquire("busy").await, slots.acquire("busy").await];
        let order = Arc::new(Mutex::new(Vec::new()));
        let wait = |ns: &'static str, i: usize| {
            let (slots, order) = (slots.clone(), order.clone());
            tokio::spawn(async move {
                let slot = slots.acquire(ns).await;
                order.lock().unwrap().push((ns, i));
                tokio::task::yield_now().await;
                drop(slot);
            })
        };
        let mut tasks: Vec<_> = (0..10).map(|i| wait("busy", i)).collect();
        while slots.load().1 < 10 {
            tokio::task::yield_now().await;
        }
        tasks.push(wait("quiet", 0));
        while slots.load().1 < 11 {
            tokio::task::yield_now().await;
        }
        drop(held);
        for t in tasks {
            t.await.unwrap();
        }
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 11);
        // The quiet namespace's reconcile is among the first two to get a slot, not the eleventh.
        let quiet = order.iter().position(|(ns, _)| *ns == "quiet").unwrap();
        assert!(quiet <= 1, "{order:?}");
        // Within the busy namespace, first come first served.
        let busy: Vec<usize> = order
            .iter()
            .filter(|(ns, _)| *ns == "busy")
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(busy, (0..10).collect::<Vec<_>>());
        assert_eq!(slots.load(), (0, 0));
    }

    #[tokio::test]
    async fn a_waiter_that_gave_up_does_not_take_a_slot_with_it() {
        let slots = Slots::new(1);
        let held = slots.acquire("a").await;
        let gone = {
            let slots = slots.clone();
            tokio::spawn(async move { slots.acquire("b").await })
        };
        while slots.load().1 < 1 {
            tokio::task::yield_now().await;
        }
        gone.abort();
        let _ = gone.await;
        drop(held);
        // The slot is free again: taken at once.
        let again =
            tokio::time::timeout(std::time::Duration::from_secs(5), slots.acquire("c")).await;
        assert!(again.is_ok());
        drop(again);
        assert_eq!(slots.load(), (0, 0));
    }
}
