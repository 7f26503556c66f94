//! The outage breaker's pure state machine (docs/worker.md, "When the handler's dependency fails"):
//! outcomes and instants in, decisions out. `worker::breaker::Breaker` wraps it for the message
//! tasks (the gate, the state for the dispatcher, metrics and log lines on every transition).
//!
//! What counts: transient failures that point at a dependency (timeouts, no connection, HTTP 5xx and
//! 429, exec exits other than 0 and 65) of messages on their first receive. A poison answer, another
//! 4xx, or the failure of a message that already failed on an earlier receive (it may be the message,
//! not the dependency) says nothing: a tenth of messages that always fail must not stop the rest.
//! HTTP 503 with Retry-After and exit 75 (EX_TEMPFAIL) open it at once.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// Outcomes older than this leave the window: at low traffic the run of consecutive failures decides.
pub const WINDOW_AGE: Duration = Duration::from_mins(1);
/// Consecutive failures in slow start that open the breaker again.
pub const RECOVERY_FAILURES: u32 = 2;
/// Longest pause a handler's Retry-After may ask for (a typo of a few digits must not pause for hours).
pub const MAX_EXPLICIT_PAUSE: Duration = Duration::from_mins(15);
/// While open, fresh messages are received to probe with only while fewer than this many times the
/// concurrency wait at the gate: a dependency that stays down is then probed with held ones alone.
pub const FRESH_PROBE_HOLD_LIMIT: usize = 2;
/// A fresh turn's probe waits this long past its due time for the messages received for it; then
/// (nothing came: an empty queue, or the slots cannot take them) a message already waiting probes.
pub const FRESH_TURN_WAIT: Duration = Duration::from_secs(5);
/// How long the breaker holds messages when `--outage-tolerance` is not given: long enough to ride
/// out most dependency incidents without spending receives, short enough that a breaker misled by
/// failures it blames on the dependency cannot keep messages from other consumers and from the DLQ
/// for SQS's whole 12 hours (docs/worker.md, "Bounds").
pub const DEFAULT_OUTAGE_TOLERANCE: Duration = Duration::from_hours(1);

/// The breaker's configuration (`--breaker*`, `--outage-tolerance`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub enabled: bool,
    /// Opens when at least this percentage of the window's outcomes are failures...
    pub failure_percent: u32,
    /// ...and the window holds this many outcomes (its size).
    pub window: usize,
    /// Or when this many failures come in a row.
    pub consecutive: u32,
    /// Probe delays: `probe_base × 2^(n-1)`, at most `probe_max`, jittered down by up to half.
    pub probe_base: Duration,
    pub probe_max: Duration,
    /// After the breaker has been open this long, messages are no longer held: they follow the
    /// normal retries toward the DLQ until a success closes it. None: held up to SQS's 12 hours.
    pub tolerance: Option<Duration>,
    /// The worker's slots: slow start ends when this many calls run again.
    pub concurrency: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            failure_percent: 50,
            window: 20,
            consecutive: 10,
            probe_base: Duration::from_secs(1),
            probe_max: Duration::from_secs(30),
            tolerance: None,
            concurrency: 10,
        }
    }
}

/// What one handler call says about the handler's dependency.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Success,
    /// Nothing about the dependency: poison, a 4xx other than 429.
    Neutral,
    /// A transient failure (timeout, no connection, 5xx, 429, an exec exit other than 0/65/75).
    /// `first_received`: for a redelivered message, how long ago SQS first delivered it. While
    /// closed, such a failure counts only if no call has succeeded since: when others succeeded
    /// after it first failed, the message, not the dependency, is the likely cause.
    Failure {
        first_received: Option<Duration>,
    },
    /// The handler said its dependency is down: HTTP 503 with Retry-After, exit 75.
    Overloaded(Option<Duration>),
}

/// The state as metrics and the dispatcher see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Closed,
    /// Intake paused; one probe at a time.
    Open,
    /// A probe succeeded: slots open again one at a time.
    Recovering,
    /// Open longer than the outage tolerance: nothing is held; closes on the next success.
    Spent,
}

impl State {
    /// `qc_worker_breaker_state`: 0 closed, 1 open (the dependency is failing: also past the outage
    /// tolerance), 2 recovering.
    pub fn gauge(self) -> i64 {
        match self {
            State::Closed => 0,
            State::Open | State::Spent => 1,
            State::Recovering => 2,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::Recovering => "recovering",
            State::Spent => "spent",
        }
    }
}

/// A message at the breaker's gate, for the choice of the next probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// It failed here before (in this receive) and is held.
    Held,
    /// It has not failed here. The best witness of whether the dependency works is one on its first
    /// receive (a redelivered one may be a message that fails by itself), sent last (`sent_ms`:
    /// the messages that opened the breaker were sent before it, and a burst of bad ones is sent
    /// together).
    Fresh { first_receive: bool, sent_ms: u64 },
}

impl Kind {
    /// How good a witness it is for a fresh probe (higher is better).
    fn witness(self) -> Option<(bool, u64)> {
        match self {
            Kind::Held => None,
            Kind::Fresh {
                first_receive,
                sent_ms,
            } => Some((first_receive, sent_ms)),
        }
    }
}

/// A change of state, with what caused it, for the log and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    pub to: State,
    pub cause: String,
}

/// Leave to call the handler. `probe`: the one call allowed while open; `limited`: counted against
/// the slow start's slots until its outcome is recorded; `suspect`: it waited at the gate while the
/// breaker was open and a fresh probe then succeeded, so its failure is its own (not counted, not held).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ticket {
    pub probe: bool,
    pub limited: bool,
    pub suspect: bool,
}

/// The gate's answer to a message that wants to call the handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Go(Ticket),
    /// Not yet: ask again at this instant, or when woken (None: only when woken).
    Wait(Option<Instant>),
    /// Past the outage tolerance: stop holding, retry the normal way.
    GiveUp,
}

#[derive(Clone, Debug, PartialEq)]
enum Phase {
    Closed,
    Open {
        episode: Instant,
        probe_at: Instant,
        attempt: u32,
        probing: bool,
    },
    Recovering {
        episode: Instant,
        allowed: usize,
        attempt: u32,
        failures: u32,
    },
    Spent,
}

/// The pure state machine.
#[derive(Clone, Debug)]
pub struct Detector {
    s: Settings,
    /// Recent counted outcomes: (when, failed), newest last, at most `s.window`.
    window: VecDeque<(Instant, bool)>,
    run: u32,
    phase: Phase,
    last_success: Option<Instant>,
    /// Calls admitted in slow start whose outcome is not recorded yet.
    running: usize,
    /// Messages waiting at the gate, in arrival order, each with whether it failed here before (is
    /// held): the probe goes to the first of the kind whose turn it is, who then goes to the back, so
    /// a message that always fails cannot keep the breaker open by itself.
    waiters: VecDeque<(u64, Kind)>,
    /// Probes alternate between a fresh message (never failed here; received for the probe when none
    /// waits) and a held one: a burst of messages that fail for their own reasons cannot keep the
    /// breaker open while the dependency is fine, and a dependency that is down is not probed only
    /// with new messages, each then held too.
    fresh_next: bool,
    /// The probe running now is a held message's.
    probing_held: bool,
    /// On this fresh turn, fresh messages arrived at the gate (or the receive for them found none):
    /// the probe goes to the best of those waiting.
    fresh_arrived: bool,
    /// Waiters at the gate when a probe succeeded: while recovering their failures are their own.
    suspects: std::collections::HashSet<u64>,
}

impl Detector {
    /// Messages waiting at the gate.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    pub fn new(s: Settings) -> Detector {
        Detector {
            s,
            window: VecDeque::new(),
            run: 0,
            phase: Phase::Closed,
            last_success: None,
            running: 0,
            waiters: VecDeque::new(),
            fresh_next: true,
            probing_held: false,
            fresh_arrived: false,
            suspects: std::collections::HashSet::new(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.s
    }

    pub fn state(&self) -> State {
        match self.phase {
            Phase::Closed => State::Closed,
            Phase::Open { .. } => State::Open,
            Phase::Recovering { .. } => State::Recovering,
            Phase::Spent => State::Spent,
        }
    }

    /// Failing messages are held (kept under their heartbeat, retried in-process) rather than
    /// handed back to the queue.
    pub fn holds(&self) -> bool {
        matches!(self.phase, Phase::Open { .. } | Phase::Recovering { .. })
    }

    /// Messages the worker may have in hand now (None: its normal capacity).
    pub fn cap(&self) -> Option<usize> {
        match self.phase {
            Phase::Open { .. } => Some(0),
            Phase::Recovering { allowed, .. } => Some(allowed),
            Phase::Closed | Phase::Spent => None,
        }
    }

    /// Open, a probe due, every message in hand (`in_flight`) waiting at the gate, and none to probe
    /// with (or it is a fresh message's turn and none on its first receive waits, while the gate has
    /// room): the dispatcher receives messages to probe with.
    pub fn wants_message(&self, now: Instant, in_flight: usize) -> bool {
        match self.phase {
            Phase::Open {
                probe_at, probing, ..
            } => {
                !probing
                    && now >= probe_at
                    && self.waiters.len() >= in_flight
                    && self.fresh_wanted()
            }
            _ => false,
        }
    }

    /// Nothing waits, or it is a fresh turn and its receive has not been made: a batch is received
    /// (newer messages than the ones at the gate), while fewer than `FRESH_PROBE_HOLD_LIMIT` ×
    /// concurrency messages wait (held ones only call as probes, one at a time, so fresh ones beside
    /// a full set of held ones run no more calls than the slots).
    fn fresh_wanted(&self) -> bool {
        self.waiters.is_empty()
            || (self.fresh_next
                && !self.fresh_arrived
                && self.waiters.len() < FRESH_PROBE_HOLD_LIMIT * self.s.concurrency.max(1))
    }

    /// A fresh turn's receive is still awaited at `now` (at most `FRESH_TURN_WAIT` past the probe's
    /// due time).
    fn fresh_pending(&self, now: Instant) -> bool {
        match self.phase {
            Phase::Open { probe_at, .. } => self.fresh_wanted() && now < probe_at + FRESH_TURN_WAIT,
            _ => false,
        }
    }

    /// When a waiter asks again by itself: at the probe's due time, at the end of a fresh turn's wait
    /// for its receive, and at the end of the outage tolerance; else when woken.
    fn waiter_wake(&self, now: Instant) -> Option<Instant> {
        let tolerance = match self.phase {
            Phase::Open { episode, .. } | Phase::Recovering { episode, .. } => {
                self.s.tolerance.map(|t| episode + t)
            }
            Phase::Closed | Phase::Spent => None,
        };
        let probe = match self.phase {
            Phase::Open {
                probe_at,
                probing: false,
                ..
            } => {
                if now < probe_at {
                    Some(probe_at)
                } else if self.fresh_pending(now) {
                    Some(probe_at + FRESH_TURN_WAIT)
                } else {
                    None
                }
            }
            _ => None,
        };
        [probe, tolerance].into_iter().flatten().min()
    }

    /// Whose turn the probe is at `now`. On a fresh turn, once its receive is in (or waited for long
    /// enough): the best fresh witness (on its first receive, sent last); on a held turn the first
    /// held one. The first waiter of any kind when none of the wanted kind waits.
    fn probe_candidate(&self, now: Instant) -> Option<u64> {
        let front = || self.waiters.front().map(|(w, _)| *w);
        if self.fresh_next {
            if self.fresh_pending(now) {
                return None;
            }
            // Reversed: of equal witnesses the one waiting longest (max_by_key takes the last).
            self.waiters
                .iter()
                .rev()
                .filter_map(|(w, k)| k.witness().map(|rank| (rank, *w)))
                .max_by_key(|(rank, _)| *rank)
                .map(|(_, w)| w)
                .or_else(front)
        } else {
            self.waiters
                .iter()
                .find(|(_, k)| *k == Kind::Held)
                .map(|(w, _)| *w)
                .or_else(front)
        }
    }

    /// A receive while open found no message: the probe goes to a message already at the gate.
    pub fn nothing_received(&mut self) {
        if matches!(self.phase, Phase::Open { .. }) {
            self.fresh_arrived = true;
        }
    }

    /// A failure of a suspect (`Ticket::suspect`) while recovering: the message's own.
    pub fn suspected(&self, ticket: Ticket, outcome: Outcome) -> bool {
        ticket.suspect
            && matches!(self.phase, Phase::Recovering { .. })
            && matches!(outcome, Outcome::Failure { .. })
    }

    /// A failure of a message that first failed `ago` (here, or on an earlier receive) is the
    /// message's own when a call has succeeded since: it is neither counted nor held.
    pub fn blames_message(&self, outcome: Outcome, now: Instant) -> bool {
        match outcome {
            Outcome::Failure {
                first_received: Some(ago),
            } => self
                .last_success
                .is_some_and(|s| now.saturating_duration_since(s) < ago),
            _ => false,
        }
    }

    /// When something changes by itself: the next probe, or the end of the outage tolerance.
    pub fn next_wake(&self) -> Option<Instant> {
        let tolerance = |episode: Instant| self.s.tolerance.map(|t| episode + t);
        match self.phase {
            Phase::Open {
                episode,
                probe_at,
                probing,
                ..
            } => {
                let probe = (!probing).then_some(probe_at);
                [probe, tolerance(episode)].into_iter().flatten().min()
            }
            Phase::Recovering { episode, .. } => tolerance(episode),
            Phase::Closed | Phase::Spent => None,
        }
    }

    /// Applies what time alone changes: past the outage tolerance, open becomes spent.
    pub fn tick(&mut self, now: Instant) -> Option<Transition> {
        let episode = match self.phase {
            Phase::Open { episode, .. } | Phase::Recovering { episode, .. } => episode,
            Phase::Closed | Phase::Spent => return None,
        };
        let tolerance = self.s.tolerance?;
        if now.saturating_duration_since(episode) < tolerance {
            return None;
        }
        self.phase = Phase::Spent;
        self.running = 0;
        Some(Transition {
            to: State::Spent,
            cause: format!(
                "open longer than the outage tolerance ({}): messages are no longer held and follow the normal retries toward the DLQ",
                crate::api::Duration::from_std(tolerance)
            ),
        })
    }

    /// Message `waiter`, fresh on its first receive, asks to call the handler.
    pub fn admit(&mut self, waiter: u64, now: Instant) -> (Admit, Option<Transition>) {
        let fresh = Kind::Fresh {
            first_receive: true,
            sent_ms: 0,
        };
        self.admit_as(waiter, fresh, now)
    }

    /// Message `waiter`, of this kind, asks to call the handler.
    pub fn admit_as(
        &mut self,
        waiter: u64,
        kind: Kind,
        now: Instant,
    ) -> (Admit, Option<Transition>) {
        let t = self.tick(now);
        let admit = match &mut self.phase {
            Phase::Closed => Admit::Go(Ticket::default()),
            Phase::Spent => {
                if self.waiters.iter().any(|(w, _)| *w == waiter) {
                    Admit::GiveUp
                } else {
                    Admit::Go(Ticket::default())
                }
            }
            Phase::Open {
                probe_at, probing, ..
            } => {
                let (probe_at, probing) = (*probe_at, *probing);
                if !self.waiters.iter().any(|(w, _)| *w == waiter) {
                    self.waiters.push_back((waiter, kind));
                    if kind != Kind::Held && now >= probe_at {
                        self.fresh_arrived = true;
                    }
                }
                if !probing && now >= probe_at && self.probe_candidate(now) == Some(waiter) {
                    if let Phase::Open { probing, .. } = &mut self.phase {
                        *probing = true;
                    }
                    self.probing_held = kind == Kind::Held;
                    self.fresh_arrived = false;
                    self.waiters.retain(|(w, _)| *w != waiter);
                    Admit::Go(Ticket {
                        probe: true,
                        limited: false,
                        suspect: false,
                    })
                } else {
                    Admit::Wait(self.waiter_wake(now))
                }
            }
            Phase::Recovering { allowed, .. } => {
                if self.running < *allowed {
                    self.running += 1;
                    self.waiters.retain(|(w, _)| *w != waiter);
                    Admit::Go(Ticket {
                        probe: false,
                        limited: true,
                        suspect: self.suspects.remove(&waiter),
                    })
                } else {
                    if !self.waiters.iter().any(|(w, _)| *w == waiter) {
                        self.waiters.push_back((waiter, kind));
                    }
                    Admit::Wait(self.waiter_wake(now))
                }
            }
        };
        (admit, t)
    }

    /// A waiter left the gate without a call (released on shutdown, given up, its task ended).
    pub fn leave(&mut self, waiter: u64) {
        self.waiters.retain(|(w, _)| *w != waiter);
        self.suspects.remove(&waiter);
    }

    fn probe_delay(&self, attempt: u32, jitter: f64) -> Duration {
        let full = self
            .s
            .probe_base
            .checked_mul(1u32 << attempt.saturating_sub(1).min(20))
            .unwrap_or(Duration::MAX)
            .min(self.s.probe_max)
            .max(self.s.probe_base.min(self.s.probe_max));
        // Down by up to half, so a fleet of workers does not probe in lockstep.
        full.mul_f64(1.0 - 0.5 * jitter.clamp(0.0, 1.0))
    }

    fn open(
        &mut self,
        now: Instant,
        episode: Instant,
        attempt: u32,
        explicit: Option<Duration>,
        jitter: f64,
        cause: String,
    ) -> Transition {
        let delay = match explicit {
            Some(d) => d.min(MAX_EXPLICIT_PAUSE),
            None => self.probe_delay(attempt.max(1), jitter),
        };
        self.phase = Phase::Open {
            episode,
            probe_at: now + delay,
            attempt: attempt.max(1),
            probing: false,
        };
        self.running = 0;
        self.fresh_next = true;
        self.suspects.clear();
        Transition {
            to: State::Open,
            cause: format!(
                "{cause}; next probe in {}",
                crate::api::Duration::from_std(Duration::from_secs(delay.as_secs()))
            ),
        }
    }

    fn close(&mut self, cause: &str) -> Transition {
        self.phase = Phase::Closed;
        self.suspects.clear();
        self.window.clear();
        self.run = 0;
        self.running = 0;
        Transition {
            to: State::Closed,
            cause: cause.to_string(),
        }
    }

    /// The outcome of a call admitted with `ticket`. `jitter` is a random number in [0, 1).
    pub fn record(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        now: Instant,
        jitter: f64,
    ) -> Option<Transition> {
        if ticket.limited {
            self.running = self.running.saturating_sub(1);
        }
        if !self.s.enabled {
            return None;
        }
        // A message that failed before and keeps failing while others succeed, or one that waited
        // through the outage and fails after a fresh probe succeeded: its own fault.
        let outcome = if self.blames_message(outcome, now) || self.suspected(ticket, outcome) {
            Outcome::Neutral
        } else {
            outcome
        };
        if outcome == Outcome::Success {
            self.last_success = Some(now);
        }
        match self.phase.clone() {
            Phase::Closed => self.record_closed(outcome, now, jitter),
            Phase::Open {
                episode,
                attempt,
                probe_at,
                ..
            } => {
                if !ticket.probe {
                    // A call started before the breaker opened: the probe decides.
                    return None;
                }
                match outcome {
                    Outcome::Success => {
                        self.suspects = self.waiters.iter().map(|(w, _)| *w).collect();
                        self.phase = Phase::Recovering {
                            episode,
                            allowed: 2.min(self.s.concurrency.max(1)),
                            attempt,
                            failures: 0,
                        };
                        if self.s.concurrency <= 2 && self.waiters.is_empty() {
                            return Some(self.close("probes succeed: slots open again"));
                        }
                        Some(Transition {
                            to: State::Recovering,
                            cause: "the probe succeeded; opening slots one at a time".into(),
                        })
                    }
                    Outcome::Neutral => {
                        // The probe message itself was bad: probe with another one at once.
                        self.phase = Phase::Open {
                            episode,
                            probe_at: now.min(probe_at),
                            attempt,
                            probing: false,
                        };
                        None
                    }
                    Outcome::Failure { .. } | Outcome::Overloaded(_) => {
                        // Alternate: after a held message's probe a fresh one's, and back.
                        self.fresh_next = self.probing_held;
                        let explicit = match outcome {
                            Outcome::Overloaded(d) => d,
                            _ => None,
                        };
                        let delay = match explicit {
                            Some(d) => d.min(MAX_EXPLICIT_PAUSE),
                            None => self.probe_delay(attempt + 1, jitter),
                        };
                        self.phase = Phase::Open {
                            episode,
                            probe_at: now + delay,
                            attempt: attempt + 1,
                            probing: false,
                        };
                        None
                    }
                }
            }
            Phase::Recovering {
                episode,
                allowed,
                attempt,
                failures,
            } => match outcome {
                Outcome::Success => {
                    let allowed = (allowed + 1).min(self.s.concurrency.max(1));
                    // Closed only once nobody waits at the gate: a closed gate lets every waiter
                    // call at once, and more may wait than the slots (fresh probes beside held ones).
                    if allowed >= self.s.concurrency && self.waiters.is_empty() {
                        return Some(self.close("slow start done: every slot open again"));
                    }
                    self.phase = Phase::Recovering {
                        episode,
                        allowed,
                        attempt,
                        failures: 0,
                    };
                    None
                }
                Outcome::Neutral => None,
                Outcome::Failure { .. } => {
                    let failures = failures + 1;
                    if failures >= RECOVERY_FAILURES {
                        return Some(self.open(
                            now,
                            episode,
                            attempt + 1,
                            None,
                            jitter,
                            format!("{failures} failures in a row while recovering"),
                        ));
                    }
                    self.phase = Phase::Recovering {
                        episode,
                        allowed,
                        attempt,
                        failures,
                    };
                    None
                }
                Outcome::Overloaded(d) => Some(self.open(
                    now,
                    episode,
                    attempt + 1,
                    d,
                    jitter,
                    "the handler said its dependency is unavailable while recovering".into(),
                )),
            },
            Phase::Spent => match outcome {
                Outcome::Success => Some(self.close("a message succeeded after the outage")),
                _ => None,
            },
        }
    }

    fn record_closed(&mut self, outcome: Outcome, now: Instant, jitter: f64) -> Option<Transition> {
        while self
            .window
            .front()
            .is_some_and(|(at, _)| now.saturating_duration_since(*at) > WINDOW_AGE)
        {
            self.window.pop_front();
        }
        let failed = match outcome {
            Outcome::Success => false,
            Outcome::Neutral => return None,
            Outcome::Failure {
                first_received: Some(ago),
            } if self
                .last_success
                .is_some_and(|s| now.saturating_duration_since(s) < ago) =>
            {
                return None;
            }
            Outcome::Failure { .. } => true,
            Outcome::Overloaded(d) => {
                return Some(self.open(
                    now,
                    now,
                    1,
                    Some(d.unwrap_or(self.s.probe_base)),
                    jitter,
                    "the handler said its dependency is unavailable (HTTP 503 with Retry-After or exit 75)".into(),
                ));
            }
        };
        self.window.push_back((now, failed));
        while self.window.len() > self.s.window.max(1) {
            self.window.pop_front();
        }
        if !failed {
            self.run = 0;
            return None;
        }
        self.run = self.run.saturating_add(1);
        let failures = self.window.iter().filter(|(_, f)| *f).count();
        let len = self.window.len();
        let ratio = len >= self.s.window
            && failures * 100 >= (self.s.failure_percent as usize).saturating_mul(len);
        if self.run >= self.s.consecutive.max(1) {
            let cause = format!("{} transient handler failures in a row", self.run);
            Some(self.open(now, now, 1, None, jitter, cause))
        } else if ratio {
            let cause = format!(
                "{failures} of the last {len} handler calls failed transiently (threshold {}%)",
                self.s.failure_percent
            );
            Some(self.open(now, now, 1, None, jitter, cause))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn settings() -> Settings {
        Settings::default()
    }

    fn fail() -> Outcome {
        Outcome::Failure {
            first_received: None,
        }
    }

    #[test]
    fn a_run_of_failures_opens_and_only_the_first_waiter_probes() {
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        for i in 0..9 {
            assert_eq!(d.record(Ticket::default(), fail(), t0, 0.0), None, "{i}");
        }
        let t = d.record(Ticket::default(), fail(), t0, 0.0).unwrap();
        assert_eq!(t.to, State::Open);
        assert_eq!(d.cap(), Some(0));
        // Probe after the base delay (no jitter), to the first waiter only.
        assert_eq!(d.admit(1, t0).0, Admit::Wait(Some(t0 + S(1))));
        assert_eq!(d.admit(2, t0).0, Admit::Wait(Some(t0 + S(1))));
        assert!(matches!(d.admit(2, t0 + S(1)).0, Admit::Wait(_)));
        // The turn's receive (fresh messages newer than those waiting) found none.
        d.nothing_received();
        assert!(matches!(d.admit(2, t0 + S(1)).0, Admit::Wait(_)));
        let (a, _) = d.admit(1, t0 + S(1));
        assert_eq!(
            a,
            Admit::Go(Ticket {
                probe: true,
                limited: false,
                suspect: false
            })
        );
        // While the probe runs, nobody else goes.
        assert_eq!(d.admit(2, t0 + S(2)).0, Admit::Wait(None));
        // It fails: the next probe doubles (2 s), and goes to the other waiter.
        d.record(
            Ticket {
                probe: true,
                limited: false,
                suspect: false,
            },
            fail(),
            t0 + S(2),
            0.0,
        );
        assert_eq!(d.admit(1, t0 + S(2)).0, Admit::Wait(Some(t0 + S(4))));
        assert!(matches!(d.admit(1, t0 + S(4)).0, Admit::Wait(_)));
        assert!(matches!(
            d.admit(2, t0 + S(4)).0,
            Admit::Go(Ticket { probe: true, .. })
        ));
    }

    #[test]
    fn a_successful_probe_starts_slowly_and_closes_at_full_concurrency() {
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        d.record(Ticket::default(), Outcome::Overloaded(Some(S(3))), t0, 0.0);
        assert_eq!(d.state(), State::Open);
        assert_eq!(d.admit(1, t0 + S(2)).0, Admit::Wait(Some(t0 + S(3))));
        d.nothing_received();
        let (Admit::Go(probe), _) = d.admit(1, t0 + S(3)) else {
            panic!("no probe")
        };
        let t = d.record(probe, Outcome::Success, t0 + S(3), 0.0).unwrap();
        assert_eq!(t.to, State::Recovering);
        assert_eq!(d.cap(), Some(2));
        let mut tickets = Vec::new();
        for w in 10..12 {
            let (Admit::Go(t), _) = d.admit(w, t0 + S(3)) else {
                panic!("slot {w}")
            };
            tickets.push(t);
        }
        assert!(matches!(d.admit(12, t0 + S(3)).0, Admit::Wait(_)));
        // It leaves the gate (a closed gate lets every waiter call at once, so none may wait).
        d.leave(12);
        let mut closed = false;
        for i in 0..20 {
            let t = tickets.pop().unwrap();
            if let Some(tr) = d.record(t, Outcome::Success, t0 + S(4), 0.0) {
                assert_eq!(tr.to, State::Closed);
                closed = true;
                break;
            }
            while let (Admit::Go(t), _) = d.admit(100 + i, t0 + S(4)) {
                tickets.push(t);
            }
            // The last one asked while the slots were full: it comes back with the next slot.
            d.leave(100 + i);
        }
        assert!(closed);
        assert_eq!(d.cap(), None);
    }

    #[test]
    fn a_burst_of_messages_failing_for_their_own_reasons_is_probed_past_with_a_fresh_message() {
        // C = 10: ten messages of a burst of bad ones fail in a row and open the breaker; they are
        // held. The first probe of the episode is a fresh message's, received for it.
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        for _ in 0..10 {
            d.record(Ticket::default(), fail(), t0, 0.0);
        }
        assert_eq!(d.state(), State::Open);
        for w in 1..=10 {
            assert!(matches!(d.admit_as(w, Kind::Held, t0).0, Admit::Wait(_)));
        }
        assert!(!d.wants_message(t0, 10), "not before the probe is due");
        assert!(
            d.wants_message(t0 + S(1), 10),
            "a fresh message is received"
        );
        // The held ones wait for it...
        assert!(matches!(
            d.admit_as(1, Kind::Held, t0 + S(1)).0,
            Admit::Wait(_)
        ));
        // ...and it probes.
        let (Admit::Go(probe), _) = d.admit_as(
            100,
            Kind::Fresh {
                first_receive: true,
                sent_ms: 0,
            },
            t0 + S(1),
        ) else {
            panic!("the fresh message probes")
        };
        assert!(probe.probe);
        let t = d.record(probe, Outcome::Success, t0 + S(1), 0.0).unwrap();
        assert_eq!(t.to, State::Recovering);
        // A held message fails again after that success: its own fault, neither counted nor held.
        let (Admit::Go(slot), _) = d.admit_as(1, Kind::Held, t0 + S(2)) else {
            panic!("a slow-start slot")
        };
        let own = Outcome::Failure {
            first_received: Some(S(2)),
        };
        assert!(d.blames_message(own, t0 + S(2)));
        for _ in 0..5 {
            assert_eq!(d.record(slot, own, t0 + S(2), 0.0), None);
        }
        assert_eq!(d.state(), State::Recovering, "never reopened by them");
    }

    #[test]
    fn probes_alternate_between_fresh_and_held_messages_while_the_dependency_is_down() {
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        d.record(Ticket::default(), Outcome::Overloaded(Some(S(1))), t0, 0.0);
        d.admit_as(1, Kind::Held, t0);
        d.admit_as(2, Kind::Held, t0);
        // Fresh first.
        assert!(d.wants_message(t0 + S(1), 2));
        let (Admit::Go(p), _) = d.admit_as(
            10,
            Kind::Fresh {
                first_receive: true,
                sent_ms: 0,
            },
            t0 + S(1),
        ) else {
            panic!()
        };
        d.record(p, fail(), t0 + S(1), 0.0);
        // It failed and is held now; the next probe (after 2 s) is a held one's: no receive.
        d.admit_as(10, Kind::Held, t0 + S(1));
        assert!(!d.wants_message(t0 + S(3), 3));
        assert!(matches!(
            d.admit_as(10, Kind::Held, t0 + S(3)).0,
            Admit::Wait(_)
        ));
        let (Admit::Go(p), _) = d.admit_as(1, Kind::Held, t0 + S(3)) else {
            panic!("the first held message probes")
        };
        d.record(p, fail(), t0 + S(3), 0.0);
        d.admit_as(1, Kind::Held, t0 + S(3));
        // Then fresh again (after 4 s).
        assert!(d.wants_message(t0 + S(7), 3));
        assert!(matches!(
            d.admit_as(2, Kind::Held, t0 + S(7)).0,
            Admit::Wait(_)
        ));
    }

    #[test]
    fn a_fresh_turn_receives_newer_messages_and_probes_with_the_best_witness() {
        let fresh = |first_receive, sent_ms| Kind::Fresh {
            first_receive,
            sent_ms,
        };
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        d.record(Ticket::default(), Outcome::Overloaded(Some(S(1))), t0, 0.0);
        d.admit_as(1, Kind::Held, t0);
        // Fresh ones from before the turn: a redelivered one, and two first receives.
        for (w, k) in [
            (2, fresh(false, 90)),
            (3, fresh(true, 10)),
            (4, fresh(true, 20)),
        ] {
            assert!(matches!(d.admit_as(w, k, t0).0, Admit::Wait(_)));
        }
        // The turn: a receive is made first (a message received is not at the gate yet, so no
        // second one meanwhile); nobody probes before it is in.
        assert!(!d.wants_message(t0 + S(1), 5));
        assert!(d.wants_message(t0 + S(1), 4));
        for (w, k) in [(1, Kind::Held), (4, fresh(true, 20))] {
            assert!(matches!(d.admit_as(w, k, t0 + S(1)).0, Admit::Wait(_)));
        }
        // It found nothing: the best witness at the gate probes, on its first receive and sent
        // last; the redelivered one, though sent later, does not.
        d.nothing_received();
        assert!(!d.wants_message(t0 + S(1), 4));
        assert!(matches!(
            d.admit_as(2, fresh(false, 90), t0 + S(1)).0,
            Admit::Wait(_)
        ));
        assert!(matches!(
            d.admit_as(3, fresh(true, 10), t0 + S(1)).0,
            Admit::Wait(_)
        ));
        let (Admit::Go(p), _) = d.admit_as(4, fresh(true, 20), t0 + S(1)) else {
            panic!("the newest first-receive message probes")
        };
        assert!(p.probe);
    }

    #[test]
    fn no_fresh_message_is_received_once_twice_the_slots_are_held() {
        let t0 = Instant::now();
        let mut d = Detector::new(Settings {
            concurrency: 2,
            ..settings()
        });
        d.record(Ticket::default(), Outcome::Overloaded(Some(S(1))), t0, 0.0);
        for w in 0..4 {
            d.admit_as(w, Kind::Held, t0);
        }
        assert!(!d.wants_message(t0 + S(1), 4));
        // The probe then goes to the first held one rather than wait for a fresh one forever.
        assert!(matches!(
            d.admit_as(0, Kind::Held, t0 + S(1)).0,
            Admit::Go(Ticket { probe: true, .. })
        ));
    }

    #[test]
    fn poison_and_failures_of_messages_that_failed_while_others_succeeded_never_open() {
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        d.record(Ticket::default(), Outcome::Success, t0, 0.5);
        // Redelivered messages first received before that success (a tail of messages that
        // always fail, the healthy ones all done): nothing counts.
        for i in 1..1000 {
            let now = t0 + Duration::from_millis(i);
            let o = if i % 2 == 0 {
                Outcome::Neutral
            } else {
                Outcome::Failure {
                    first_received: Some(Duration::from_millis(i) + S(1)),
                }
            };
            assert_eq!(d.record(Ticket::default(), o, now, 0.5), None);
        }
        assert_eq!(d.state(), State::Closed);
    }

    #[test]
    fn redelivered_failures_with_no_success_since_count() {
        // A FIFO queue of few groups: the same messages fail again and again, nothing succeeds.
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        d.record(Ticket::default(), Outcome::Success, t0, 0.0);
        let later = t0 + S(10);
        let mut opened = None;
        for i in 0..10u32 {
            let o = Outcome::Failure {
                first_received: Some(S(5)),
            };
            if d.record(Ticket::default(), o, later, 0.0).is_some() {
                opened = Some(i);
            }
        }
        assert_eq!(opened, Some(9));
    }

    #[test]
    fn the_ratio_opens_over_a_full_window() {
        let t0 = Instant::now();
        let mut d = Detector::new(settings());
        // Alternating: 50 % failures, never 10 in a row; opens once 20 are in the window.
        let mut opened_at = None;
        for i in 0..40u32 {
            let o = if i % 2 == 0 { Outcome::Success } else { fail() };
            if d.record(Ticket::default(), o, t0, 0.0).is_some() {
                opened_at = Some(i);
                break;
            }
        }
        assert_eq!(opened_at, Some(19));
    }

    #[test]
    fn past_the_tolerance_nothing_is_held() {
        let t0 = Instant::now();
        let mut d = Detector::new(Settings {
            tolerance: Some(S(60)),
            ..settings()
        });
        d.record(
            Ticket::default(),
            Outcome::Overloaded(Some(S(120))),
            t0,
            0.0,
        );
        assert!(d.holds());
        assert!(matches!(d.admit(1, t0 + S(30)).0, Admit::Wait(_)));
        let (a, t) = d.admit(1, t0 + S(60));
        assert_eq!(a, Admit::GiveUp);
        assert_eq!(t.map(|t| t.to), Some(State::Spent));
        assert!(!d.holds());
        // New messages go; failures do not open it again until a success closes it.
        assert!(matches!(d.admit(2, t0 + S(61)).0, Admit::Go(_)));
        for _ in 0..50 {
            assert_eq!(d.record(Ticket::default(), fail(), t0 + S(61), 0.0), None);
        }
        let t = d.record(Ticket::default(), Outcome::Success, t0 + S(62), 0.0);
        assert_eq!(t.map(|t| t.to), Some(State::Closed));
    }

    #[test]
    fn disabled_never_opens() {
        let t0 = Instant::now();
        let mut d = Detector::new(Settings {
            enabled: false,
            ..settings()
        });
        for _ in 0..100 {
            assert_eq!(
                d.record(Ticket::default(), Outcome::Overloaded(None), t0, 0.0),
                None
            );
        }
        assert_eq!(d.state(), State::Closed);
    }

    #[test]
    fn probe_delays_double_to_the_cap_with_jitter_down_to_half() {
        let d = Detector::new(settings());
        assert_eq!(d.probe_delay(1, 0.0), S(1));
        assert_eq!(d.probe_delay(2, 0.0), S(2));
        assert_eq!(d.probe_delay(5, 0.0), S(16));
        assert_eq!(d.probe_delay(6, 0.0), S(30));
        assert_eq!(d.probe_delay(u32::MAX, 0.0), S(30));
        assert_eq!(d.probe_delay(6, 1.0), S(15));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn outcome() -> impl Strategy<Value = Outcome> {
            prop_oneof![
                Just(Outcome::Success),
                Just(Outcome::Neutral),
                Just(Outcome::Failure {
                    first_received: None
                }),
                (0u64..120).prop_map(|s| Outcome::Failure {
                    first_received: Some(S(s))
                }),
                proptest::option::of(0u64..3600).prop_map(|d| Outcome::Overloaded(d.map(S))),
            ]
        }

        /// Drives a detector with outcomes at the given gaps (ms); probes and slow-start tickets are
        /// taken from `admit` like the gate does, so every recorded ticket was really issued.
        fn drive(d: &mut Detector, t0: Instant, steps: &[(Outcome, u64, f64)]) -> Instant {
            let mut now = t0;
            for (i, (o, gap, jitter)) in steps.iter().enumerate() {
                now += Duration::from_millis(*gap);
                let Admit::Go(ticket) = d.admit(i as u64, now).0 else {
                    d.leave(i as u64);
                    continue;
                };
                d.record(ticket, *o, now, *jitter);
            }
            now
        }

        proptest! {
            #[test]
            fn never_opens_on_poison_or_success(
                steps in proptest::collection::vec(
                    (prop_oneof![Just(Outcome::Success), Just(Outcome::Neutral)], 0u64..5000, 0.0f64..1.0),
                    0..300,
                )
            ) {
                let mut d = Detector::new(Settings::default());
                drive(&mut d, Instant::now(), &steps);
                prop_assert_eq!(d.state(), State::Closed);
                prop_assert_eq!(d.cap(), None);
            }

            #[test]
            fn never_holds_past_the_outage_tolerance(
                steps in proptest::collection::vec((outcome(), 0u64..5000, 0.0f64..1.0), 0..200),
                tolerance in 1u64..600,
            ) {
                let tolerance = S(tolerance);
                let mut d = Detector::new(Settings { tolerance: Some(tolerance), ..Settings::default() });
                let t0 = Instant::now();
                let mut now = t0;
                let mut episode: Option<Instant> = None;
                for (i, (o, gap, jitter)) in steps.iter().enumerate() {
                    now += Duration::from_millis(*gap);
                    let before = d.state();
                    if let Admit::Go(t) = d.admit(i as u64, now).0 {
                        d.record(t, *o, now, *jitter);
                    } else {
                        d.leave(i as u64);
                    }
                    match (before, d.state()) {
                        (State::Closed | State::Spent, State::Open) => episode = Some(now),
                        (_, State::Closed | State::Spent) => episode = None,
                        _ => {}
                    }
                    if let Some(e) = episode {
                        // Holding only within the tolerance of the episode's start.
                        prop_assert!(!d.holds() || now < e + tolerance, "held {:?} past {:?}", now - e, tolerance);
                        prop_assert!(d.next_wake().is_some_and(|w| w <= e + tolerance));
                    }
                }
                // Whatever happened, once the tolerance has passed nothing is held.
                d.tick(now + tolerance);
                prop_assert!(!d.holds());
            }

            #[test]
            fn an_open_breaker_always_probes_again(
                steps in proptest::collection::vec((outcome(), 0u64..5000, 0.0f64..1.0), 1..200),
            ) {
                let mut d = Detector::new(Settings::default());
                let mut now = drive(&mut d, Instant::now(), &steps);
                d.record(Ticket::default(), Outcome::Overloaded(None), now, 0.0);
                if d.state() == State::Open {
                    // A held message is probed no later than the longest pause from now.
                    let wake = d.next_wake().expect("an open breaker has a next probe");
                    prop_assert!(wake <= now + MAX_EXPLICIT_PAUSE.max(Settings::default().probe_max));
                    now = now.max(wake);
                    let (a, _) = d.admit(999_999, now);
                    prop_assert!(matches!(a, Admit::Go(Ticket { probe: true, .. })), "{:?}", a);
                } else {
                    // Recovering (an open breaker's probe had been taken) or closed.
                    prop_assert!(d.state() != State::Spent);
                }
            }
        }
    }
}
