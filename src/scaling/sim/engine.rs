//! The simulated queue: messages arrive from the trace and wait in order; replicas with C slots take them
//! as soon as a slot is free; replicas start after a delay and, when removed, finish what they hold first.
//!
//! Discrete-event, integer milliseconds, no randomness of its own: the same messages and the same scaling
//! calls give the same result bit for bit. Clones are cheap (messages are borrowed), which the oracle uses.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::trace::Msg;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Starting,
    Ready,
    Draining,
    Gone,
}

#[derive(Clone, Debug)]
struct Replica {
    state: State,
    busy: u32,
    /// Creation order: ties in scale-in pick the newest, as a ReplicaSet does.
    seq: u64,
}

/// What a scaler can read: the queue's counts (as GetQueueAttributes would report them) and the replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Messages waiting (ApproximateNumberOfMessages).
    pub visible: u64,
    /// Messages being handled (ApproximateNumberOfMessagesNotVisible).
    pub in_flight: u64,
    /// Replicas asked for (Deployment spec.replicas).
    pub replicas: u32,
    /// Replicas ready to take messages.
    pub ready: u32,
    /// Messages handled and deleted since the start (the workers' deleted counters, summed).
    pub deleted: u64,
    /// Age of the oldest waiting message, ms (ApproximateAgeOfOldestMessage); 0 when none waits.
    pub oldest_age_ms: u64,
}

/// Per-message and per-second measurements of one run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    /// Wait of every started message (arrival to start of handling), in start order, ms.
    pub waits_ms: Vec<u64>,
    /// Per message, from its arrival to the end of its handling (its deletion): the wait plus its service
    /// time, what the workers' `qc_worker_message_dwell_seconds` measures. In completion order, ms.
    pub dwells_ms: Vec<u64>,
    pub completed: u64,
    /// Completions by replicas already removed from the Deployment (drained, not cut).
    pub completed_while_draining: u64,
    /// Whole seconds simulated, and those at which the oldest waiting message was older than the target.
    pub seconds: u64,
    pub over_target_seconds: u64,
    pub max_backlog_age_ms: u64,
}

#[derive(Clone, Debug)]
pub struct Engine<'a> {
    msgs: &'a [Msg],
    now: u64,
    /// msgs[..arrived] have been sent; msgs[started..arrived] wait (FIFO); msgs[..started] were received.
    arrived: usize,
    started: usize,
    replicas: Vec<Replica>,
    reusable: Vec<usize>,
    /// (when, replica, the message's dwell in ms at that moment)
    completions: BinaryHeap<Reverse<(u64, usize, u64)>>,
    /// Messages deleted per bucket of `telemetry::LATENCY_BUCKETS` by their dwell (the last entry: beyond
    /// the last bound), as the workers' histogram counts them.
    dwell_buckets: Vec<u64>,
    starting: BinaryHeap<Reverse<(u64, usize, u64)>>,
    concurrency: u32,
    startup_ms: u64,
    target_age_ms: u64,
    target: u32,
    active: u32,
    ready: u32,
    existing: u32,
    free_slots: u64,
    in_flight: u64,
    deleted: u64,
    next_seq: u64,
    next_second: u64,
    replica_ms: u128,
    scale_events: u32,
    deadline_ms: Option<u64>,
    violated: bool,
    stats: Option<Stats>,
}

impl<'a> Engine<'a> {
    /// An empty system at t=0 with no replicas. `target_age_ms` is maxBacklogAge (for the per-second check).
    pub fn new(
        msgs: &'a [Msg],
        concurrency: u32,
        startup_ms: u64,
        target_age_ms: u64,
    ) -> Engine<'a> {
        Engine {
            msgs,
            now: 0,
            arrived: 0,
            started: 0,
            replicas: Vec::new(),
            reusable: Vec::new(),
            completions: BinaryHeap::new(),
            dwell_buckets: vec![0; crate::telemetry::LATENCY_BUCKETS.len() + 1],
            starting: BinaryHeap::new(),
            concurrency: concurrency.max(1),
            startup_ms,
            target_age_ms,
            target: 0,
            active: 0,
            ready: 0,
            existing: 0,
            free_slots: 0,
            in_flight: 0,
            deleted: 0,
            next_seq: 0,
            next_second: 0,
            replica_ms: 0,
            scale_events: 0,
            deadline_ms: None,
            violated: false,
            stats: None,
        }
    }

    /// Record per-message waits and per-second backlog age (off for the oracle's what-if clones).
    pub fn recording(mut self) -> Self {
        self.stats = Some(Stats {
            waits_ms: Vec::with_capacity(self.msgs.len()),
            dwells_ms: Vec::with_capacity(self.msgs.len()),
            ..Stats::default()
        });
        self
    }

    /// What-if mode: stop as soon as a message waits longer than `ms`, and remember that it did.
    pub fn with_deadline(&mut self, ms: u64) {
        self.deadline_ms = Some(ms);
        self.violated = false;
    }

    pub fn violated(&self) -> bool {
        self.violated
    }

    pub fn now(&self) -> u64 {
        self.now
    }

    pub fn target(&self) -> u32 {
        self.target
    }

    pub fn scale_events(&self) -> u32 {
        self.scale_events
    }

    pub fn replica_seconds(&self) -> f64 {
        self.replica_ms as f64 / 1000.0
    }

    pub fn stats(&self) -> Option<&Stats> {
        self.stats.as_ref()
    }

    pub fn into_stats(self) -> Option<Stats> {
        self.stats
    }

    pub fn waiting(&self) -> u64 {
        (self.arrived - self.started) as u64
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Replicas that exist and cost: starting, ready and draining.
    pub fn existing(&self) -> u32 {
        self.existing
    }

    pub fn unserved(&self) -> u64 {
        (self.msgs.len() - self.started) as u64
    }

    /// Every message has arrived, been handled and deleted.
    pub fn is_idle(&self) -> bool {
        self.arrived == self.msgs.len() && self.started == self.arrived && self.in_flight == 0
    }

    pub fn observe(&self) -> Observation {
        Observation {
            visible: self.waiting(),
            in_flight: self.in_flight,
            replicas: self.target,
            ready: self.ready,
            deleted: self.deleted,
            oldest_age_ms: if self.started < self.arrived {
                self.now.saturating_sub(self.msgs[self.started].at)
            } else {
                0
            },
        }
    }

    /// Replicas that exist at t=0, ready, as if started `startup` earlier (and paid for since then).
    pub fn prestart(&mut self, n: u32) {
        for _ in 0..n {
            self.spawn(true);
        }
        self.target = self.active;
        self.replica_ms += u128::from(n) * u128::from(self.startup_ms);
        self.dispatch();
    }

    /// Set the Deployment's replicas: new ones start (ready after the start-up delay); removed ones are
    /// chosen as a ReplicaSet would (not-ready first, then the least busy, then the newest) and drain.
    pub fn set_target(&mut self, n: u32) {
        if n != self.target {
            self.scale_events += 1;
            self.target = n;
        }
        while self.active < n {
            self.spawn(self.startup_ms == 0);
        }
        while self.active > n {
            self.remove_one();
        }
        self.dispatch();
    }

    /// Advance to `t`, handling every event before it (events at exactly `t` are left for the next call).
    pub fn run_until(&mut self, t: u64) {
        while !self.violated {
            let next = self.next_event();
            if next >= t {
                self.check_deadline(t);
                self.advance(t.max(self.now));
                return;
            }
            self.check_deadline(next);
            if self.violated {
                return;
            }
            self.advance(next);
            while let Some(&Reverse((at, idx, dwell))) = self.completions.peek() {
                if at != next {
                    break;
                }
                self.completions.pop();
                self.complete(idx, dwell);
            }
            while let Some(&Reverse((at, idx, seq))) = self.starting.peek() {
                if at != next {
                    break;
                }
                self.starting.pop();
                let r = &mut self.replicas[idx];
                if r.state == State::Starting && r.seq == seq {
                    r.state = State::Ready;
                    self.ready += 1;
                    self.free_slots += u64::from(self.concurrency);
                }
            }
            while self.arrived < self.msgs.len() && self.msgs[self.arrived].at == next {
                self.arrived += 1;
            }
            self.dispatch();
            if next == self.next_second {
                self.second_mark();
            }
        }
    }

    fn next_event(&self) -> u64 {
        let mut next = u64::MAX;
        if let Some(Reverse((at, _, _))) = self.completions.peek() {
            next = next.min(*at);
        }
        if let Some(Reverse((at, _, _))) = self.starting.peek() {
            next = next.min(*at);
        }
        if let Some(m) = self.msgs.get(self.arrived) {
            next = next.min(m.at);
        }
        if self.stats.is_some() {
            next = next.min(self.next_second);
        }
        next
    }

    fn advance(&mut self, to: u64) {
        self.replica_ms += u128::from(self.existing) * u128::from(to - self.now);
        self.now = to;
    }

    fn check_deadline(&mut self, at: u64) {
        if let Some(d) = self.deadline_ms
            && self.started < self.arrived
            && self.msgs[self.started].at + d < at
        {
            self.violated = true;
        }
    }

    fn second_mark(&mut self) {
        let oldest = (self.started < self.arrived).then(|| self.now - self.msgs[self.started].at);
        if let Some(st) = self.stats.as_mut() {
            st.seconds += 1;
            if let Some(age) = oldest {
                st.max_backlog_age_ms = st.max_backlog_age_ms.max(age);
                if age > self.target_age_ms {
                    st.over_target_seconds += 1;
                }
            }
        }
        self.next_second += 1000;
    }

    fn spawn(&mut self, ready: bool) {
        let replica = Replica {
            state: if ready { State::Ready } else { State::Starting },
            busy: 0,
            seq: self.next_seq,
        };
        self.next_seq += 1;
        let idx = if let Some(i) = self.reusable.pop() {
            self.replicas[i] = replica;
            i
        } else {
            self.replicas.push(replica);
            self.replicas.len() - 1
        };
        self.active += 1;
        self.existing += 1;
        if ready {
            self.ready += 1;
            self.free_slots += u64::from(self.concurrency);
        } else {
            self.starting.push(Reverse((
                self.now + self.startup_ms,
                idx,
                self.replicas[idx].seq,
            )));
        }
    }

    fn remove_one(&mut self) {
        let newest_starting = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == State::Starting)
            .max_by_key(|(_, r)| r.seq)
            .map(|(i, _)| i);
        if let Some(i) = newest_starting {
            self.replicas[i].state = State::Gone;
            self.reusable.push(i);
            self.active -= 1;
            self.existing -= 1;
            return;
        }
        let victim = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, r)| r.state == State::Ready)
            .min_by_key(|(_, r)| (r.busy, Reverse(r.seq)))
            .map(|(i, _)| i);
        let Some(i) = victim else { return };
        let c = self.concurrency;
        let r = &mut self.replicas[i];
        self.free_slots -= u64::from(c - r.busy);
        self.ready -= 1;
        self.active -= 1;
        if r.busy == 0 {
            r.state = State::Gone;
            self.reusable.push(i);
            self.existing -= 1;
        } else {
            r.state = State::Draining;
        }
    }

    /// The workers' cumulative dwell histogram so far (`qc_worker_message_dwell_seconds` summed over
    /// the replicas, none of which restarts here).
    pub fn dwell_histogram(&self) -> crate::scaling::objective::Histogram {
        let bounds = crate::telemetry::LATENCY_BUCKETS;
        let mut running = 0;
        let cumulative = self.dwell_buckets[..bounds.len()]
            .iter()
            .map(|c| {
                running += c;
                running
            })
            .collect();
        crate::scaling::objective::Histogram {
            bounds: bounds.to_vec(),
            cumulative,
            count: self.deleted,
        }
    }

    fn complete(&mut self, idx: usize, dwell_ms: u64) {
        // the bucket the worker's histogram puts it in: the first bound at or above it
        let seconds = dwell_ms as f64 / 1000.0;
        let bucket = crate::telemetry::LATENCY_BUCKETS.partition_point(|b| *b < seconds);
        self.dwell_buckets[bucket] += 1;
        let r = &mut self.replicas[idx];
        r.busy -= 1;
        self.in_flight -= 1;
        self.deleted += 1;
        let draining = r.state == State::Draining;
        match r.state {
            State::Ready => self.free_slots += 1,
            State::Draining if r.busy == 0 => {
                r.state = State::Gone;
                self.reusable.push(idx);
                self.existing -= 1;
            }
            _ => {}
        }
        if let Some(st) = self.stats.as_mut() {
            st.completed += 1;
            st.dwells_ms.push(dwell_ms);
            if draining {
                st.completed_while_draining += 1;
            }
        }
    }

    /// Hand waiting messages to free slots, oldest first, to the ready replica with the most free slots
    /// (workers poll independently, so load spreads; ties go to the lowest index, for determinism).
    fn dispatch(&mut self) {
        while self.started < self.arrived && self.free_slots > 0 {
            let c = self.concurrency;
            let Some(idx) = self
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.state == State::Ready && r.busy < c)
                .max_by_key(|(i, r)| (c - r.busy, Reverse(*i)))
                .map(|(i, _)| i)
            else {
                return;
            };
            let m = self.msgs[self.started];
            self.started += 1;
            self.replicas[idx].busy += 1;
            self.free_slots -= 1;
            self.in_flight += 1;
            let dwell = self.now - m.at + u64::from(m.service);
            self.completions
                .push(Reverse((self.now + u64::from(m.service), idx, dwell)));
            if let Some(st) = self.stats.as_mut() {
                st.waits_ms.push(self.now - m.at);
            }
        }
    }
}
