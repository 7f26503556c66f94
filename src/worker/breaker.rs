//! The outage breaker (docs/worker.md, "When the handler's dependency fails"): when the handler's
//! own dependency fails (its database, an API it calls), the worker stops receiving, keeps the
//! messages it holds under their heartbeats instead of handing them back to burn receives toward
//! the DLQ, probes the handler with one of them on a backoff, and on a successful probe opens its
//! slots again one at a time (slow start).
//!
//! `Detector` is the pure state machine: outcomes and instants in, decisions out. `Breaker` wraps it
//! for the message tasks: a gate each handler call passes (without a lock while closed), the state
//! for the dispatcher, metrics and log lines on every transition.
//!
//! What counts: transient failures that point at a dependency (timeouts, no connection, HTTP 5xx and
//! 429, exec exits other than 0 and 65) of messages on their first receive. A poison answer, another
//! 4xx, or the failure of a message that already failed on an earlier receive (it may be the message,
//! not the dependency) says nothing: a tenth of messages that always fail must not stop the rest.
//! HTTP 503 with Retry-After and exit 75 (EX_TEMPFAIL) open it at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

pub use super::core::breaker::*;
use super::metrics::Metrics;

/// The breaker the message tasks share.
pub struct Breaker {
    detector: Mutex<Detector>,
    /// Closed (or disabled): a call passes the gate without taking the lock.
    closed: AtomicBool,
    enabled: bool,
    shutdown: AtomicBool,
    notify: Notify,
    state: watch::Sender<State>,
    next_waiter: AtomicU64,
    metrics: Arc<Metrics>,
}

/// Why a message left the gate without a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denied {
    /// Shutting down: release the message.
    ShuttingDown,
    /// Past the outage tolerance: retry the normal way.
    GaveUp,
}

impl Breaker {
    pub fn new(settings: Settings, metrics: Arc<Metrics>) -> Breaker {
        let (state, _) = watch::channel(State::Closed);
        Breaker {
            enabled: settings.enabled,
            detector: Mutex::new(Detector::new(settings)),
            closed: AtomicBool::new(true),
            shutdown: AtomicBool::new(false),
            notify: Notify::new(),
            state,
            next_waiter: AtomicU64::new(0),
            metrics,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn subscribe(&self) -> watch::Receiver<State> {
        self.state.subscribe()
    }

    fn with<T>(&self, f: impl FnOnce(&mut Detector) -> T) -> Option<T> {
        self.detector.lock().ok().map(|mut d| f(&mut d))
    }

    pub fn state(&self) -> State {
        *self.state.borrow()
    }

    pub fn holds(&self) -> bool {
        self.enabled && self.with(|d| d.holds()).unwrap_or(false)
    }

    pub fn cap(&self) -> Option<usize> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        self.with(|d| d.cap()).flatten()
    }

    /// A receive while open found no message (`Detector::nothing_received`).
    pub fn nothing_received(&self) {
        if !self.closed.load(Ordering::Acquire) {
            let _ = self.with(Detector::nothing_received);
            self.notify.notify_waiters();
        }
    }

    pub fn wants_message(&self, now: Instant, in_flight: usize) -> bool {
        !self.closed.load(Ordering::Acquire)
            && !self.shutdown.load(Ordering::Acquire)
            && self
                .with(|d| d.wants_message(now, in_flight))
                .unwrap_or(false)
    }

    pub fn next_wake(&self) -> Option<Instant> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        self.with(|d| d.next_wake()).flatten()
    }

    /// What time alone changes (the outage tolerance); the dispatcher calls it at `next_wake`.
    pub fn tick(&self, now: Instant) {
        if let Some(Some(t)) = self.with(|d| d.tick(now)) {
            self.transition(&t);
        }
    }

    /// Shutting down: every message waiting at the gate leaves it to be released.
    pub fn shut_down(&self) {
        self.shutdown.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// Leave to call the handler at once, while closed (no lock, no wait); None: ask `admit`.
    pub fn try_pass(&self) -> Option<Pass<'_>> {
        (!self.enabled || self.closed.load(Ordering::Acquire)).then(|| Pass {
            breaker: self,
            ticket: Ticket::default(),
            done: false,
        })
    }

    /// Waits until the message may call the handler. Returns at once while closed. `kind`: held
    /// (it failed here before), or fresh, redelivered or on its first receive (probes alternate
    /// between held and fresh messages).
    pub async fn admit(&self, kind: Kind) -> Result<Pass<'_>, Denied> {
        self.admit_ticket(kind).await.map(|ticket| Pass {
            breaker: self,
            ticket,
            done: false,
        })
    }

    async fn admit_ticket(&self, kind: Kind) -> Result<Ticket, Denied> {
        if !self.enabled || self.closed.load(Ordering::Acquire) {
            return Ok(Ticket::default());
        }
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        let _waiting = Waiting { breaker: self, id };
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shutdown.load(Ordering::Acquire) {
                return Err(Denied::ShuttingDown);
            }
            let Some((admit, t, waiting)) = self.with(|d| {
                let (a, t) = d.admit_as(id, kind, Instant::now());
                (a, t, d.waiting())
            }) else {
                return Ok(Ticket::default());
            };
            self.metrics
                .breaker_held
                .set(i64::try_from(waiting).unwrap_or(i64::MAX));
            if let Some(t) = t {
                self.transition(&t);
            }
            match admit {
                Admit::Go(ticket) => {
                    if ticket.probe {
                        tracing::info!(
                            "probing the handler with one {} message",
                            if kind == Kind::Held { "held" } else { "fresh" }
                        );
                    }
                    return Ok(ticket);
                }
                Admit::GiveUp => return Err(Denied::GaveUp),
                Admit::Wait(until) => match until {
                    Some(at) => {
                        tokio::select! {
                            () = &mut notified => {}
                            () = tokio::time::sleep_until(at) => {}
                        }
                    }
                    None => notified.await,
                },
            }
        }
    }

    /// Records a call's outcome; true when the call failed and its message is to be held for the
    /// next probe (the breaker is open or recovering, and the failure is not the message's own).
    fn record(&self, ticket: Ticket, outcome: Outcome) -> bool {
        if !self.enabled {
            return false;
        }
        if ticket.probe {
            let label = usize::from(outcome != Outcome::Success);
            self.metrics.breaker_probes[label].inc();
        }
        let now = Instant::now();
        let failed = matches!(outcome, Outcome::Failure { .. } | Outcome::Overloaded(_));
        let (t, hold) = self
            .with(|d| {
                let own = d.blames_message(outcome, now) || d.suspected(ticket, outcome);
                let t = d.record(ticket, outcome, now, fastrand::f64());
                (t, failed && !own && d.holds())
            })
            .unwrap_or((None, false));
        if let Some(t) = t {
            self.transition(&t);
        } else if ticket.limited || ticket.probe {
            // A slot or the probe is free again.
            self.notify.notify_waiters();
            if ticket.probe {
                // Still open: the dispatcher learns when the next probe falls due (it may have to
                // receive a fresh message for it).
                self.state.send_replace(self.state());
            }
        }
        hold
    }

    fn transition(&self, t: &Transition) {
        let from = self.state();
        self.closed.store(
            matches!(t.to, State::Closed | State::Spent),
            Ordering::Release,
        );
        let m = &self.metrics;
        m.breaker_state.set(t.to.gauge());
        m.breaker_transitions[t.to as usize].inc();
        m.breaker_episode(t.to != State::Closed);
        match t.to {
            State::Open => {
                tracing::warn!(from = from.as_str(), cause = %t.cause, "breaker open: the handler's dependency is failing; receiving paused, held messages kept under heartbeats and retried in-process");
            }
            State::Recovering => {
                tracing::info!(cause = %t.cause, "breaker recovering: slow start");
            }
            State::Closed => {
                tracing::info!(from = from.as_str(), cause = %t.cause, "breaker closed: receiving at full concurrency");
            }
            State::Spent => {
                tracing::warn!(cause = %t.cause, "breaker gave up holding messages");
            }
        }
        self.state.send_replace(t.to);
        self.notify.notify_waiters();
    }
}

/// Leave to make one handler call; its outcome is recorded once (Neutral if dropped unrecorded, so
/// a probe or a slow-start slot is never lost to an early return or an aborted task).
pub struct Pass<'a> {
    breaker: &'a Breaker,
    ticket: Ticket,
    done: bool,
}

impl Pass<'_> {
    pub fn probe(&self) -> bool {
        self.ticket.probe
    }

    /// Records the call's outcome; true when its message is to be held for the next probe.
    #[must_use = "a failed message is held only when this says so"]
    pub fn record(mut self, outcome: Outcome) -> bool {
        self.done = true;
        self.breaker.record(self.ticket, outcome)
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.breaker.record(self.ticket, Outcome::Neutral);
        }
    }
}

/// A message at the gate; leaves the waiters' line when dropped.
struct Waiting<'a> {
    breaker: &'a Breaker,
    id: u64,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        // One lock: leave the line and read what is left of it.
        let held = self.breaker.with(|d| {
            d.leave(self.id);
            d.waiting()
        });
        self.breaker.notify.notify_waiters();
        self.breaker
            .metrics
            .breaker_held
            .set(held.map_or(0, |n| i64::try_from(n).unwrap_or(i64::MAX)));
    }
}
