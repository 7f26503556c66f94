//! The oracle: a capacity plan made with the whole future known (every arrival and service time), using as
//! few replicas as it can find while every message still starts within maxBacklogAge.
//!
//! How (docs/scaling.md has the long form): time is cut into windows; for each window a greedy search picks
//! the fewest ready replicas such that, holding that count for a lookahead and then running at maxReplicas,
//! no message waits longer than the target, checked by simulating the real queue forward. Several
//! lookaheads (and the best constant count) are tried; each plan is replayed in the real engine with the
//! start-up delay (replicas are started early, and paid for while starting) and the cheapest plan that
//! keeps every wait within the target wins. It is a strong reference, not a proven optimum.

use super::engine::Engine;
use super::trace::Msg;

/// Inputs of the planner, in milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    pub concurrency: u32,
    pub startup_ms: u64,
    pub target_ms: u64,
    pub max_replicas: u32,
    pub window_ms: u64,
    pub horizon_ms: u64,
    /// Give up simulating this long after the horizon (work that cannot be finished).
    pub tail_ms: u64,
}

/// A replica schedule: replicas ready at t=0 (started before it) and (time ms, replicas) changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub initial: u32,
    pub changes: Vec<(u64, u32)>,
    pub label: String,
}

/// Candidate plans, cheapest search first; the caller replays each and keeps the best.
pub fn candidates(msgs: &[Msg], p: &Params) -> Vec<Plan> {
    let t = p.target_ms;
    let mut plans = Vec::new();
    for lookahead in [0, t / 2, t, 2 * t] {
        let ready = greedy(msgs, p, lookahead);
        let mut plan = prestarted(&ready, p);
        plan.label = format!("greedy, {}s lookahead", lookahead / 1000);
        plans.push(plan);
    }
    plans
}

/// A constant replica count from t=0 (started before it).
pub fn constant(n: u32) -> Plan {
    Plan {
        initial: n,
        changes: Vec::new(),
        label: format!("constant {n}"),
    }
}

/// Ready replicas per window, chosen greedily with the future known.
fn greedy(msgs: &[Msg], p: &Params, lookahead_ms: u64) -> Vec<u32> {
    let mut state = Engine::new(msgs, p.concurrency, 0, p.target_ms);
    let mut ready = Vec::new();
    let mut carry: Option<Engine<'_>> = None;
    let mut n = 0u32;
    let mut t = 0u64;
    while !(t >= p.horizon_ms && state.is_idle()) && t < p.horizon_ms + p.tail_ms {
        let search = Search {
            state: &state,
            t,
            p,
            lookahead_ms: lookahead_ms.max(p.window_ms),
        };
        let (chosen, what_if) = search.fewest(n, carry.take());
        n = chosen;
        carry = what_if;
        state.set_target(n);
        t += p.window_ms;
        state.run_until(t);
        ready.push(n);
    }
    ready
}

/// One window's search for the fewest replicas.
struct Search<'s, 'a> {
    state: &'s Engine<'a>,
    t: u64,
    p: &'s Params,
    lookahead_ms: u64,
}

impl<'a> Search<'_, 'a> {
    /// The fewest replicas for the window, searching from the previous window's count (feasibility is
    /// monotone in the count: more servers never make a FIFO message start later). Also returns the
    /// what-if run of the chosen count, positioned at the end of its lookahead, so that the next window
    /// can check the same count by simulating one more window instead of the whole lookahead.
    fn fewest(&self, prev: u32, carry: Option<Engine<'a>>) -> (u32, Option<Engine<'a>>) {
        let max = self.p.max_replicas;
        let prev = prev.min(max);
        let Some(at_prev) = self.check_continuing(prev, carry) else {
            let mut k = prev + 1;
            while k < max {
                if let Some(run) = self.check(k) {
                    return (k, Some(run));
                }
                k += 1;
            }
            return (max, None);
        };
        let (mut best, mut run) = (prev, at_prev);
        while best > 0 {
            match self.check(best - 1) {
                Some(r) => {
                    best -= 1;
                    run = r;
                }
                None => break,
            }
        }
        (best, Some(run))
    }

    /// `n` replicas from `t`: the what-if run at the end of the lookahead when every wait stays in time.
    fn check(&self, n: u32) -> Option<Engine<'a>> {
        let mut s = self.state.clone();
        s.with_deadline(self.p.target_ms);
        s.set_target(n);
        self.finish(s)
    }

    /// As [`Search::check`] for the previous window's count, continuing that window's what-if run.
    fn check_continuing(&self, n: u32, carry: Option<Engine<'a>>) -> Option<Engine<'a>> {
        match carry {
            Some(s) if s.target() == n && s.now() <= self.t + self.lookahead_ms => self.finish(s),
            _ => self.check(n),
        }
    }

    /// Run the what-if to the end of the lookahead, then at maxReplicas until the backlog is gone.
    fn finish(&self, mut s: Engine<'a>) -> Option<Engine<'a>> {
        let mut until = self.t + self.lookahead_ms;
        s.run_until(until);
        if s.violated() {
            return None;
        }
        let at_lookahead = s.clone();
        s.set_target(self.p.max_replicas);
        let give_up = until + self.p.target_ms * 10 + self.p.tail_ms;
        while !s.violated() && s.waiting() > 0 && until < give_up {
            until += self.p.window_ms;
            s.run_until(until);
        }
        (!s.violated()).then_some(at_lookahead)
    }
}

/// Turn ready-capacity-per-window into a Deployment schedule: a replica needed at a window's start is
/// created one start-up delay earlier; gaps shorter than the start-up delay are bridged as a result.
fn prestarted(ready: &[u32], p: &Params) -> Plan {
    let startup_s = p.startup_ms.div_ceil(1000);
    let window_s = (p.window_ms / 1000).max(1);
    let seconds = ready.len() as u64 * window_s;
    let mut per_second = vec![0u32; seconds as usize];
    let mut initial = 0u32;
    for (w, &r) in ready.iter().enumerate() {
        let start = w as u64 * window_s;
        let from = start.saturating_sub(startup_s);
        if start < startup_s {
            initial = initial.max(r);
        }
        for slot in &mut per_second[from as usize..(start + window_s) as usize] {
            *slot = (*slot).max(r);
        }
    }
    let mut changes = Vec::new();
    let mut last = initial;
    for (s, &n) in per_second.iter().enumerate() {
        if n != last {
            changes.push((s as u64 * 1000, n));
            last = n;
        }
    }
    if last != 0 {
        changes.push((seconds * 1000, 0));
    }
    Plan {
        initial,
        changes,
        label: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            concurrency: 1,
            startup_ms: 10_000,
            target_ms: 20_000,
            max_replicas: 10,
            window_ms: 5_000,
            horizon_ms: 120_000,
            tail_ms: 60_000,
        }
    }

    #[test]
    fn greedy_defers_a_lone_message_to_its_deadline_and_uses_one_replica() {
        let msgs = [Msg {
            at: 30_000,
            service: 1_000,
        }];
        let ready = greedy(&msgs, &params(), 0);
        assert_eq!(ready.iter().copied().max(), Some(1));
        // the window in which it starts is the last one that still meets the 20 s target
        let first = ready.iter().position(|&n| n > 0).unwrap() as u64;
        assert_eq!(first * 5_000, 50_000);
    }

    #[test]
    fn a_burst_needs_enough_replicas_to_start_everything_in_time() {
        // 40 messages of 10 s at once, one slot per replica, 20 s target: 10 replicas for 2 rounds would
        // start the last round at +10 s; fewer cannot start all 40 within 20 s
        let msgs: Vec<Msg> = (0..40)
            .map(|_| Msg {
                at: 0,
                service: 10_000,
            })
            .collect();
        let p = Params {
            max_replicas: 40,
            ..params()
        };
        let ready = greedy(&msgs, &p, 0);
        let peak = ready.iter().copied().max().unwrap();
        assert!((14..=40).contains(&peak), "peak {peak}");
    }

    #[test]
    fn prestart_creates_replicas_one_startup_early_and_bridges_short_gaps() {
        let p = params();
        // windows of 5 s: 0 0 0 0 2 0 2 0 0 ...
        let ready = [0, 0, 0, 0, 2, 0, 2, 0, 0, 0, 0];
        let plan = prestarted(&ready, &p);
        assert_eq!(plan.initial, 0);
        // needed at 20 s → created at 10 s; the 5 s gap at 25 s is shorter than the 10 s start-up: kept
        assert_eq!(plan.changes, vec![(10_000, 2), (35_000, 0)]);
        let early = prestarted(&[3, 0, 0, 0, 0], &p);
        assert_eq!(early.initial, 3);
    }
}
