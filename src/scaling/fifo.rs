//! FIFO queues in the pure core: the parallelism message groups allow, the throughput a FIFO queue
//! takes, and which groups are stuck or hot. No I/O, no clock.
//!
//! A FIFO queue hands out one message of a group at a time (the next only after the previous is
//! deleted), so at most one slot per active group is ever busy: replicas × slots beyond the groups
//! wait, paid for and idle.

use std::time::Duration;

/// Slots allowed beyond one per active group, in percent: groups come and go between two polls.
pub const HEADROOM_PERCENT: u64 = 25;
/// API calls per second per action a FIFO queue takes (SQS's quota without high throughput).
pub const CALLS_PER_SECOND: u32 = 300;
/// Messages per second in high-throughput mode, a conservative figure (the quota varies by region
/// and is far higher in the largest ones).
pub const HIGH_THROUGHPUT_MESSAGES_PER_SECOND: u32 = 18_000;

/// Slots the groups can keep busy: one per group, plus the headroom (rounded up).
pub fn useful_slots(groups: u32) -> u32 {
    let g = u64::from(groups);
    u32::try_from((g * (100 + HEADROOM_PERCENT)).div_ceil(100)).unwrap_or(u32::MAX)
}

/// The most replicas `groups` active groups can use with `slots` message slots each: ceil(useful
/// slots / slots), at least 1.
pub fn replica_cap(groups: u32, slots: u32) -> u32 {
    useful_slots(groups).div_ceil(slots.max(1)).max(1)
}

/// The groups to cap replicas at: the fewer of the declared `scaling.messageGroups` and the groups
/// the workers hold, the latter only while it is below the slots the `current` replicas have (slots
/// then idle for want of groups: every group with a visible head is held). With every slot busy the
/// workers cannot tell how many more groups wait, so their count caps nothing. None: no cap.
pub fn cap_groups(
    declared: Option<u32>,
    held: Option<u64>,
    current: u32,
    slots: u32,
) -> Option<u32> {
    let observed = held
        .filter(|&h| h < u64::from(current) * u64::from(slots.max(1)))
        .map(|h| u32::try_from(h).unwrap_or(u32::MAX));
    match (declared, observed) {
        (Some(d), Some(o)) => Some(d.min(o)),
        (d, o) => d.or(o),
    }
}

/// Messages per second a FIFO queue takes for a consumer receiving `batch_size` at a time: 300
/// receives (and 300 delete batches) a second, so 300 × batchSize (3,000 with batches of 10); in
/// high-throughput mode, [`HIGH_THROUGHPUT_MESSAGES_PER_SECOND`].
pub fn throughput_limit(batch_size: u32, high_throughput: bool) -> u32 {
    if high_throughput {
        HIGH_THROUGHPUT_MESSAGES_PER_SECOND
    } else {
        CALLS_PER_SECOND.saturating_mul(batch_size.clamp(1, 10))
    }
}

/// What a worker reports of one group it holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupHead {
    pub group: String,
    /// Since the group's head (the message it handles or waits to handle) was first received.
    pub head_age: Duration,
    /// Failed handler calls of the head in a row.
    pub head_failures: u32,
    /// Messages of the group the worker holds (head included).
    pub held: u64,
}

/// When a group counts as stuck or hot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    /// The head failed this many times in a row.
    pub failures: u32,
    /// The head is older than this.
    pub age: Duration,
    /// The group holds at least this percentage of the messages held (with more than one group).
    pub hot_percent: u32,
    /// At most this many groups named in each list.
    pub top: usize,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            failures: 3,
            age: Duration::from_mins(5),
            hot_percent: 40,
            top: 5,
        }
    }
}

/// Why a group is stuck.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stuck {
    /// Its head failed this many times in a row.
    HeadFailing { failures: u32, age: Duration },
    /// Its head is this old.
    HeadOld { age: Duration },
}

/// The groups worth naming.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupHealth {
    /// Active groups (distinct ids reported).
    pub active: u32,
    /// Stuck groups, worst first (most failures, then oldest head), at most `top`.
    pub stuck: Vec<(String, Stuck)>,
    /// Hot groups with their share of the held messages in percent, largest first, at most `top`.
    pub hot: Vec<(String, u32)>,
}

/// Classify the groups the workers report (a group reported by two workers, during a hand-over,
/// counts once with the worse head).
pub fn classify(heads: &[GroupHead], t: Thresholds) -> GroupHealth {
    let mut by: std::collections::BTreeMap<&str, GroupHead> = std::collections::BTreeMap::new();
    for h in heads {
        by.entry(h.group.as_str())
            .and_modify(|e| {
                e.head_age = e.head_age.max(h.head_age);
                e.head_failures = e.head_failures.max(h.head_failures);
                e.held += h.held;
            })
            .or_insert_with(|| h.clone());
    }
    let total: u64 = by.values().map(|h| h.held).sum();
    let mut stuck: Vec<(String, Stuck)> = by
        .values()
        .filter_map(|h| {
            let why = if h.head_failures >= t.failures {
                Stuck::HeadFailing {
                    failures: h.head_failures,
                    age: h.head_age,
                }
            } else if h.head_age > t.age {
                Stuck::HeadOld { age: h.head_age }
            } else {
                return None;
            };
            Some((h.group.clone(), why))
        })
        .collect();
    let rank = |s: &Stuck| match s {
        Stuck::HeadFailing { failures, age } => (*failures, *age),
        Stuck::HeadOld { age } => (0, *age),
    };
    stuck.sort_by(|a, b| rank(&b.1).cmp(&rank(&a.1)).then_with(|| a.0.cmp(&b.0)));
    stuck.truncate(t.top);
    let mut hot: Vec<(String, u32)> = if by.len() > 1 && total > 0 {
        by.values()
            .filter_map(|h| {
                let pct = u32::try_from(h.held * 100 / total).unwrap_or(100);
                (pct >= t.hot_percent).then(|| (h.group.clone(), pct))
            })
            .collect()
    } else {
        Vec::new()
    };
    hot.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    hot.truncate(t.top);
    GroupHealth {
        active: u32::try_from(by.len()).unwrap_or(u32::MAX),
        stuck,
        hot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_capped_at_the_slots_the_groups_can_use() {
        assert_eq!(useful_slots(0), 0);
        assert_eq!(useful_slots(2), 3);
        assert_eq!(useful_slots(8), 10);
        assert_eq!(useful_slots(100), 125);
        assert_eq!(replica_cap(2, 10), 1);
        assert_eq!(replica_cap(2, 1), 3);
        assert_eq!(replica_cap(100, 10), 13);
        assert_eq!(replica_cap(0, 10), 1, "at least one replica");
        assert_eq!(replica_cap(5, 0), 7, "no slots counts as one");
    }

    #[test]
    fn the_workers_groups_cap_only_while_slots_idle_for_want_of_groups() {
        // 3 replicas × 10 slots: 4 groups held leave slots idle, so 4 caps; 30 held could be more.
        assert_eq!(cap_groups(None, Some(4), 3, 10), Some(4));
        assert_eq!(cap_groups(None, Some(30), 3, 10), None);
        assert_eq!(cap_groups(Some(8), Some(30), 3, 10), Some(8));
        assert_eq!(cap_groups(Some(8), Some(4), 3, 10), Some(4));
        assert_eq!(cap_groups(Some(8), None, 0, 10), Some(8));
        assert_eq!(
            cap_groups(None, Some(0), 0, 10),
            None,
            "no replicas: nothing observed"
        );
        assert_eq!(cap_groups(None, None, 3, 10), None);
    }

    #[test]
    fn the_fifo_limit_is_300_calls_times_the_batch_or_high_throughput() {
        assert_eq!(throughput_limit(1, false), 300);
        assert_eq!(throughput_limit(10, false), 3000);
        assert_eq!(throughput_limit(50, false), 3000);
        assert_eq!(
            throughput_limit(1, true),
            HIGH_THROUGHPUT_MESSAGES_PER_SECOND
        );
    }

    fn head(group: &str, age_s: u64, failures: u32, held: u64) -> GroupHead {
        GroupHead {
            group: group.into(),
            head_age: Duration::from_secs(age_s),
            head_failures: failures,
            held,
        }
    }

    #[test]
    fn stuck_groups_fail_repeatedly_or_are_old_and_hot_groups_hold_a_large_share() {
        let h = classify(
            &[
                head("a", 10, 0, 50),
                head("b", 400, 0, 30),
                head("c", 20, 5, 10),
                head("d", 1, 0, 10),
                head("a", 12, 1, 0), // the same group on a second worker
            ],
            Thresholds::default(),
        );
        assert_eq!(h.active, 4);
        assert_eq!(
            h.stuck,
            vec![
                (
                    "c".to_string(),
                    Stuck::HeadFailing {
                        failures: 5,
                        age: Duration::from_secs(20)
                    }
                ),
                (
                    "b".to_string(),
                    Stuck::HeadOld {
                        age: Duration::from_secs(400)
                    }
                ),
            ]
        );
        assert_eq!(h.hot, vec![("a".to_string(), 50)]);
        // One group alone is not "hot": it is the whole queue.
        assert!(
            classify(&[head("a", 1, 0, 99)], Thresholds::default())
                .hot
                .is_empty()
        );
        // Bounded lists.
        let many: Vec<GroupHead> = (0..20).map(|i| head(&format!("g{i}"), 999, 9, 1)).collect();
        assert_eq!(classify(&many, Thresholds::default()).stuck.len(), 5);
    }
}
