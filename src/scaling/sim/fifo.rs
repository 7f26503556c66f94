//! A FIFO queue in the simulator: messages belong to message groups, and a group's next message starts
//! only after its previous one is done, whatever the free slots. Our policy drives the replicas as the
//! controller does (one sample per pollInterval into a History, then `decide`), with or without the
//! message-group cap ([`crate::scaling::fifo::replica_cap`] over the groups active at the sample: the
//! groups the workers report holding).
//!
//! Pure and deterministic, stepped every 100 ms (coarser than the standard queue's engine: it answers
//! "how many replicas", not waits to the millisecond).

use std::collections::VecDeque;

use super::SimConfig;
use crate::api::Duration;
use crate::scaling::{History, Sample, Timestamp, decide, fifo};

const STEP_MS: u64 = 100;

/// One message of a FIFO trace: sent at `at` ms into `group`, handled in `service` ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FifoMsg {
    pub at: u64,
    pub group: u32,
    pub service: u32,
}

/// A trace with `hot` groups receiving `hot_per_second` messages each and `cold` groups receiving
/// one message every `cold_every_s` seconds each, for `seconds`; every message takes `service_ms`.
/// Arrivals are spread evenly within each second (deterministic).
pub fn hot_groups_trace(
    seconds: u64,
    hot: u32,
    hot_per_second: u32,
    cold: u32,
    cold_every_s: u64,
    service_ms: u32,
) -> Vec<FifoMsg> {
    let mut out = Vec::new();
    for s in 0..seconds {
        for g in 0..hot {
            for k in 0..hot_per_second {
                out.push(FifoMsg {
                    at: s * 1000 + u64::from(k) * 1000 / u64::from(hot_per_second.max(1)),
                    group: g,
                    service: service_ms,
                });
            }
        }
        for c in 0..cold {
            if (s + u64::from(c)) % cold_every_s.max(1) == 0 {
                out.push(FifoMsg {
                    at: s * 1000 + 500,
                    group: hot + c,
                    service: service_ms,
                });
            }
        }
    }
    out.sort_by_key(|m| (m.at, m.group));
    out
}

/// What one run did.
#[derive(Clone, Debug, PartialEq)]
pub struct FifoOutcome {
    /// The most replicas asked for.
    pub max_replicas: u32,
    /// The most groups active (waiting or in flight) at a sample.
    pub max_active_groups: u32,
    /// The cap the most active groups allow ([`fifo::replica_cap`]).
    pub group_cap: u32,
    pub served: u64,
    pub unserved: u64,
    /// Replica-seconds paid (starting and ready).
    pub replica_seconds: f64,
    /// The longest a message waited, ms.
    pub max_wait_ms: u64,
}

struct Group {
    waiting: VecDeque<FifoMsg>,
    busy_until: Option<u64>,
}

/// Run our policy over `msgs` (sorted by `at`) for `seconds`, then at most [`super::TAIL`] more while
/// messages remain; `cap_groups`: apply the message-group cap to each decision.
pub fn run_fifo(cfg: &SimConfig, msgs: &[FifoMsg], seconds: u64, cap_groups: bool) -> FifoOutcome {
    let groups_n = msgs.iter().map(|m| m.group + 1).max().unwrap_or(0) as usize;
    let mut groups: Vec<Group> = (0..groups_n)
        .map(|_| Group {
            waiting: VecDeque::new(),
            busy_until: None,
        })
        .collect();
    let slots_per = cfg.concurrency.max(1);
    let startup = u64::try_from(cfg.startup.as_millis()).unwrap_or(u64::MAX);
    let poll = u64::try_from(cfg.scaling.poll_interval.as_millis())
        .unwrap_or(u64::MAX)
        .max(1000);
    let mut history = History::for_spec(&cfg.scaling, Some(cfg.startup));
    // Replicas: when each becomes ready (in creation order).
    let mut replicas: Vec<u64> = Vec::new();
    let (mut next_msg, mut next_poll, mut deleted, mut deleted_at_sample) =
        (0usize, 0u64, 0u64, 0u64);
    let mut out = FifoOutcome {
        max_replicas: 0,
        max_active_groups: 0,
        group_cap: 1,
        served: 0,
        unserved: 0,
        replica_seconds: 0.0,
        max_wait_ms: 0,
    };
    let end = seconds * 1000 + u64::try_from(super::TAIL.as_millis()).unwrap_or(0);
    let mut t = 0u64;
    while t <= end {
        // Completions, then arrivals.
        for g in &mut groups {
            if g.busy_until.is_some_and(|u| u <= t) {
                g.busy_until = None;
                deleted += 1;
            }
        }
        while next_msg < msgs.len() && msgs[next_msg].at <= t {
            let m = msgs[next_msg];
            groups[m.group as usize].waiting.push_back(m);
            next_msg += 1;
        }
        // Sample and decide.
        if t >= next_poll {
            next_poll = t + poll;
            let visible: u64 = groups.iter().map(|g| g.waiting.len() as u64).sum();
            let in_flight = groups.iter().filter(|g| g.busy_until.is_some()).count() as u64;
            let active = groups
                .iter()
                .filter(|g| g.busy_until.is_some() || !g.waiting.is_empty())
                .count();
            let active = u32::try_from(active).unwrap_or(u32::MAX);
            out.max_active_groups = out.max_active_groups.max(active);
            let oldest = groups
                .iter()
                .filter_map(|g| g.waiting.front())
                .map(|m| t - m.at)
                .max();
            let at = Timestamp::from_millis(t);
            let sample = Sample {
                visible,
                in_flight,
                delayed: 0,
                deleted: Some(deleted - deleted_at_sample),
                oldest_age: Some(Duration::from_millis(oldest.unwrap_or(0))),
                at,
            };
            deleted_at_sample = deleted;
            if history.push(sample).is_ok() {
                let current = u32::try_from(replicas.len()).unwrap_or(u32::MAX);
                let mut want = decide(
                    &cfg.scaling,
                    cfg.p99,
                    cfg.mean,
                    cfg.concurrency,
                    &history,
                    current,
                    at,
                )
                .replicas;
                if cap_groups && want > 0 {
                    let cap = fifo::replica_cap(active, slots_per)
                        .max(cfg.scaling.min_replicas.min(cfg.scaling.max_replicas));
                    want = want.min(cap);
                }
                out.max_replicas = out.max_replicas.max(want);
                while replicas.len() < want as usize {
                    replicas.push(t + startup);
                }
                replicas.truncate(want as usize);
            }
        }
        // Dispatch: one message per idle group, oldest head first, into free slots.
        let ready = replicas.iter().filter(|&&r| r <= t).count() as u64;
        let mut free = (ready * u64::from(slots_per))
            .saturating_sub(groups.iter().filter(|g| g.busy_until.is_some()).count() as u64);
        while free > 0 {
            let Some(g) = groups
                .iter_mut()
                .filter(|g| g.busy_until.is_none() && !g.waiting.is_empty())
                .min_by_key(|g| g.waiting.front().map_or(u64::MAX, |m| m.at))
            else {
                break;
            };
            let Some(m) = g.waiting.pop_front() else {
                break;
            };
            g.busy_until = Some(t + u64::from(m.service).max(1));
            out.max_wait_ms = out.max_wait_ms.max(t - m.at);
            out.served += 1;
            free -= 1;
        }
        out.replica_seconds += replicas.len() as f64 * STEP_MS as f64 / 1000.0;
        let idle = next_msg == msgs.len()
            && groups
                .iter()
                .all(|g| g.busy_until.is_none() && g.waiting.is_empty());
        if t >= seconds * 1000 && idle {
            break;
        }
        t += STEP_MS;
    }
    out.unserved = msgs.len() as u64 - out.served;
    out.group_cap = fifo::replica_cap(out.max_active_groups, slots_per);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_puts_the_load_on_the_hot_groups() {
        let msgs = hot_groups_trace(10, 2, 5, 3, 5, 100);
        assert_eq!(msgs.iter().filter(|m| m.group < 2).count(), 100);
        assert_eq!(msgs.iter().filter(|m| m.group >= 2).count(), 6);
        assert!(msgs.windows(2).all(|w| w[0].at <= w[1].at));
    }
}
