//! Dead-letter queue triage, the pure part: what a peek of a DLQ saw, summarised by reason, source
//! queue and age, and which messages a selective redrive takes. No I/O and no clock (`now` is given).
//!
//! The reason is the `qc-poison-reason` message attribute the worker attaches to its dead-letter sends.
//! Anyone allowed to send to the DLQ can write any attribute, so a reason is a label for triage, never
//! a credential: it only narrows what a redrive takes, and a redrive only ever moves to the
//! QueueConsumer's own source queue (src/aws/redrive.rs), whatever a message says.

use std::collections::BTreeMap;
use std::time::Duration;

/// The reason key of a message without a `qc-poison-reason` attribute: moved by the queue's redrive
/// policy after `maxReceiveCount` receives (transient failures, timeouts, an outage), or sent to the
/// DLQ by something other than qc-worker.
pub const NO_REASON: &str = "(none)";
/// The reason key of a `qc-poison-reason` attribute that is not a string (a forged or foreign one).
pub const NOT_A_STRING: &str = "(not a string)";
/// Longest reason key, in characters: a forged attribute of 256 KiB does not flood the output.
pub const MAX_REASON_KEY: usize = 200;
/// The message attribute an automatic redrive after recovery adds to each message it moves (its
/// value: the redrive's token): a message carrying it is never moved automatically again.
pub const AUTO_REDRIVE_ATTRIBUTE: &str = "qc-auto-redrive";
/// SQS's limit of message attributes per message.
pub const MAX_ATTRIBUTES: usize = 10;
/// Reasons listed by default; the rest are summed under [`OTHER`].
pub const DEFAULT_TOP: usize = 10;
/// The key under which the reasons (or sources) beyond the top N are summed.
pub const OTHER: &str = "(other)";

/// What a peek saw of one DLQ message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peeked {
    pub id: String,
    /// The reason key ([`reason_key`]).
    pub reason: String,
    /// The source queue the message names (SQS's `DeadLetterQueueSourceArn`, else the worker's
    /// `qc-source-arn`); None when it names none.
    pub source: Option<String>,
    /// SQS's `SentTimestamp`, in ms since the epoch: the send to the DLQ for the worker's dead-letter
    /// sends, the original send to the source for what a redrive policy moved (SQS keeps it).
    pub sent_at_ms: Option<u64>,
    /// `ApproximateReceiveCount` on the DLQ, this peek's receive included.
    pub receive_count: u32,
    /// Whether it carries a `qc-poison-reason` attribute at all (even an empty one).
    pub reason_attribute: bool,
    /// Whether it carries [`AUTO_REDRIVE_ATTRIBUTE`]: an automatic redrive moved it before.
    pub auto_redriven: bool,
    /// How many message attributes it carries.
    pub attributes: usize,
}

/// Whether an automatic redrive after recovery may move `p`: dead-lettered for a transient cause
/// (no `qc-poison-reason` attribute at all: the redrive policy moved it after maxReceiveCount
/// receives; the worker attaches a reason to every poison message it dead-letters), never moved
/// automatically before, and with room for the mark (a poison message that already carried ten
/// attributes is dead-lettered without its reason, so one without room is never taken).
pub fn is_transient(p: &Peeked) -> bool {
    !p.reason_attribute && !p.auto_redriven && p.attributes < MAX_ATTRIBUTES
}

/// The reason key of an attribute value: control characters escaped (a terminal never interprets
/// what a sender wrote), cut at [`MAX_REASON_KEY`] characters; [`NO_REASON`] when absent or empty.
pub fn reason_key(value: Option<&str>) -> String {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return NO_REASON.to_string();
    };
    let mut out = String::new();
    for (n, c) in v.chars().enumerate() {
        if n == MAX_REASON_KEY {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// How many messages share a key, and the oldest of them.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Count {
    pub key: String,
    pub count: u64,
    /// Seconds since the oldest one's `SentTimestamp`; None when none had one.
    pub oldest_age_seconds: Option<u64>,
}

/// Messages by age (since `SentTimestamp`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Ages {
    pub under_1h: u64,
    pub under_1d: u64,
    pub under_7d: u64,
    pub older: u64,
    pub unknown: u64,
}

/// A DLQ's triage summary.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Messages peeked (each counted once).
    pub total: u64,
    /// The top reasons, most messages first (ties by key); the rest summed under [`OTHER`].
    pub by_reason: Vec<Count>,
    /// The top source queues (ARNs, or [`NO_REASON`]-like `(none)` for messages naming none).
    pub by_source: Vec<Count>,
    pub ages: Ages,
}

fn age_secs(sent_at_ms: Option<u64>, now_ms: u64) -> Option<u64> {
    sent_at_ms.map(|s| now_ms.saturating_sub(s) / 1000)
}

/// Group `keys` (with each message's age) into the top `top` counts plus one [`OTHER`] line.
fn top_counts<'a>(items: impl Iterator<Item = (&'a str, Option<u64>)>, top: usize) -> Vec<Count> {
    let mut by: BTreeMap<&str, (u64, Option<u64>)> = BTreeMap::new();
    for (key, age) in items {
        let e = by.entry(key).or_insert((0, None));
        e.0 += 1;
        e.1 = e.1.max(age);
    }
    let mut counts: Vec<Count> = by
        .into_iter()
        .map(|(key, (count, oldest))| Count {
            key: key.to_string(),
            count,
            oldest_age_seconds: oldest,
        })
        .collect();
    counts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.key.cmp(&b.key)));
    let top = top.max(1);
    if counts.len() > top {
        let rest = counts.split_off(top);
        counts.push(Count {
            key: OTHER.to_string(),
            count: rest.iter().map(|c| c.count).sum(),
            oldest_age_seconds: rest.iter().filter_map(|c| c.oldest_age_seconds).max(),
        });
    }
    counts
}

/// Summarise what a peek saw. A message seen twice (SQS may hand one message to two receives) is
/// counted once.
pub fn summarise(peeked: &[Peeked], now_ms: u64, top: usize) -> Summary {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&Peeked> = peeked.iter().filter(|p| seen.insert(&p.id)).collect();
    let mut ages = Ages::default();
    for p in &unique {
        match age_secs(p.sent_at_ms, now_ms) {
            None => ages.unknown += 1,
            Some(a) if a < 3600 => ages.under_1h += 1,
            Some(a) if a < 86_400 => ages.under_1d += 1,
            Some(a) if a < 7 * 86_400 => ages.under_7d += 1,
            Some(_) => ages.older += 1,
        }
    }
    Summary {
        total: unique.len() as u64,
        by_reason: top_counts(
            unique
                .iter()
                .map(|p| (p.reason.as_str(), age_secs(p.sent_at_ms, now_ms))),
            top,
        ),
        by_source: top_counts(
            unique.iter().map(|p| {
                (
                    p.source.as_deref().unwrap_or(NO_REASON),
                    age_secs(p.sent_at_ms, now_ms),
                )
            }),
            top,
        ),
        ages,
    }
}

/// Which messages a selective redrive takes: all of the given reasons (none given: any reason) and
/// sent within the window. A message without a `SentTimestamp` is outside any window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// Reason keys, as the summary prints them ([`NO_REASON`] for messages without one).
    pub reasons: Vec<String>,
    /// Only messages at most this old.
    pub newer_than: Option<Duration>,
    /// Only messages at least this old.
    pub older_than: Option<Duration>,
    /// Only messages an automatic redrive after recovery may move ([`is_transient`]).
    pub transient_only: bool,
}

/// A selection that can never select anything, or is otherwise wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "--newer-than {newer:?} is shorter than --older-than {older:?}: no message can be both; widen the window (newer-than must be the larger age)"
    )]
    EmptyWindow { newer: Duration, older: Duration },
    #[error("--reason is empty: give a reason as `qc-operator dlq` prints it, or (none)")]
    EmptyReason,
}

impl Selector {
    /// Check the selection; an empty window or an empty reason is refused, never silently matches
    /// nothing.
    pub fn validate(&self) -> Result<(), SelectorError> {
        if self.reasons.iter().any(|r| r.trim().is_empty()) {
            return Err(SelectorError::EmptyReason);
        }
        if let (Some(newer), Some(older)) = (self.newer_than, self.older_than)
            && newer < older
        {
            return Err(SelectorError::EmptyWindow { newer, older });
        }
        Ok(())
    }

    /// Whether this selects everything (no reason, no window).
    pub fn is_all(&self) -> bool {
        self.reasons.is_empty()
            && self.newer_than.is_none()
            && self.older_than.is_none()
            && !self.transient_only
    }

    /// Whether the message `p` is selected at `now_ms`.
    pub fn selects(&self, p: &Peeked, now_ms: u64) -> bool {
        if self.transient_only && !is_transient(p) {
            return false;
        }
        if !self.reasons.is_empty() && !self.reasons.iter().any(|r| r.trim() == p.reason) {
            return false;
        }
        if self.newer_than.is_none() && self.older_than.is_none() {
            return true;
        }
        let Some(age_ms) = p.sent_at_ms.map(|s| now_ms.saturating_sub(s)) else {
            return false;
        };
        let age = Duration::from_millis(age_ms);
        self.newer_than.is_none_or(|n| age <= n) && self.older_than.is_none_or(|o| age >= o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_000_000_000_000;

    fn p(id: &str, reason: Option<&str>, source: Option<&str>, age_s: Option<u64>) -> Peeked {
        Peeked {
            id: id.into(),
            reason: reason_key(reason),
            source: source.map(str::to_string),
            sent_at_ms: age_s.map(|a| NOW - a * 1000),
            receive_count: 1,
            reason_attribute: reason.is_some(),
            auto_redriven: false,
            attributes: usize::from(reason.is_some()),
        }
    }

    #[test]
    fn only_messages_without_a_reason_never_moved_automatically_and_with_room_are_transient() {
        let none = p("1", None, None, Some(5));
        assert!(is_transient(&none));
        assert!(!is_transient(&p(
            "1",
            Some("handler answered HTTP 422"),
            None,
            Some(5)
        )));
        let empty_reason = Peeked {
            reason_attribute: true,
            ..none.clone()
        };
        assert_eq!(empty_reason.reason, NO_REASON);
        assert!(
            !is_transient(&empty_reason),
            "an empty reason attribute is still a reason: never taken automatically"
        );
        let again = Peeked {
            auto_redriven: true,
            ..none.clone()
        };
        assert!(!is_transient(&again), "moved automatically once already");
        let full = Peeked {
            attributes: MAX_ATTRIBUTES,
            ..none.clone()
        };
        assert!(
            !is_transient(&full),
            "ten attributes: maybe poison whose reason had no room"
        );
        let sel = Selector {
            transient_only: true,
            ..Selector::default()
        };
        assert!(!sel.is_all());
        assert!(sel.selects(&none, NOW));
        assert!(!sel.selects(&again, NOW));
    }

    #[test]
    fn reason_keys_escape_control_characters_and_are_bounded() {
        assert_eq!(reason_key(None), NO_REASON);
        assert_eq!(reason_key(Some("  ")), NO_REASON);
        assert_eq!(reason_key(Some("HTTP 422")), "HTTP 422");
        assert_eq!(
            reason_key(Some("x\u{1b}[31mred\n")),
            "x\\u{1b}[31mred",
            "a terminal escape is printed, not obeyed (the trailing newline is trimmed)"
        );
        let long = "é".repeat(10_000);
        let k = reason_key(Some(&long));
        assert_eq!(k.chars().count(), MAX_REASON_KEY + 1);
        assert!(k.ends_with('…'));
    }

    #[test]
    fn the_summary_counts_each_message_once_by_reason_source_and_age() {
        let a = "arn:aws:sqs:us-east-1:1:orders";
        let ms = vec![
            p("1", Some("HTTP 422"), Some(a), Some(10)),
            p("2", Some("HTTP 422"), Some(a), Some(7200)),
            p("2", Some("HTTP 422"), Some(a), Some(7200)), // handed twice
            p("3", None, None, Some(90_000)),
            p("4", Some("exit 65"), Some(a), Some(8 * 86_400)),
            p("5", Some("exit 65"), Some(a), None),
        ];
        let s = summarise(&ms, NOW, 10);
        assert_eq!(s.total, 5);
        assert_eq!(
            s.by_reason,
            vec![
                Count {
                    key: "HTTP 422".into(),
                    count: 2,
                    oldest_age_seconds: Some(7200)
                },
                Count {
                    key: "exit 65".into(),
                    count: 2,
                    oldest_age_seconds: Some(8 * 86_400)
                },
                Count {
                    key: NO_REASON.into(),
                    count: 1,
                    oldest_age_seconds: Some(90_000)
                },
            ]
        );
        assert_eq!(s.by_source[0].key, a);
        assert_eq!(s.by_source[0].count, 4);
        assert_eq!(s.by_source[1].key, NO_REASON);
        assert_eq!(
            s.ages,
            Ages {
                under_1h: 1,
                under_1d: 1,
                under_7d: 1,
                older: 1,
                unknown: 1
            }
        );
    }

    #[test]
    fn reasons_beyond_the_top_n_are_summed_under_other() {
        let ms: Vec<Peeked> = (0..30)
            .map(|i| p(&i.to_string(), Some(&format!("r{}", i % 15)), None, Some(i)))
            .collect();
        let s = summarise(&ms, NOW, 3);
        assert_eq!(s.by_reason.len(), 4);
        assert_eq!(s.by_reason[3].key, OTHER);
        assert_eq!(s.by_reason.iter().map(|c| c.count).sum::<u64>(), 30);
        assert_eq!(s.by_reason[3].count, 24);
    }

    #[test]
    fn a_selector_takes_only_the_chosen_reasons_within_the_window() {
        let by_reason = Selector {
            reasons: vec!["HTTP 422".into()],
            ..Selector::default()
        };
        assert!(by_reason.selects(&p("1", Some("HTTP 422"), None, Some(5)), NOW));
        assert!(by_reason.selects(&p("1", Some("HTTP 422"), None, None), NOW));
        assert!(!by_reason.selects(&p("1", Some("HTTP 4220"), None, Some(5)), NOW));
        assert!(!by_reason.selects(&p("1", None, None, Some(5)), NOW));
        let none = Selector {
            reasons: vec![NO_REASON.into()],
            ..Selector::default()
        };
        assert!(none.selects(&p("1", None, None, Some(5)), NOW));
        assert!(!none.selects(&p("1", Some("x"), None, Some(5)), NOW));

        let window = Selector {
            reasons: vec![],
            newer_than: Some(Duration::from_hours(1)),
            older_than: Some(Duration::from_mins(1)),
            transient_only: false,
        };
        assert!(window.validate().is_ok());
        assert!(window.selects(&p("1", Some("x"), None, Some(60)), NOW));
        assert!(window.selects(&p("1", Some("x"), None, Some(3600)), NOW));
        assert!(!window.selects(&p("1", Some("x"), None, Some(59)), NOW));
        assert!(!window.selects(&p("1", Some("x"), None, Some(3601)), NOW));
        assert!(
            !window.selects(&p("1", Some("x"), None, None), NOW),
            "no SentTimestamp: outside any window"
        );
        assert!(Selector::default().is_all());
        assert!(Selector::default().selects(&p("1", None, None, None), NOW));
    }

    #[test]
    fn an_empty_window_or_reason_is_refused_naming_the_flag() {
        let e = Selector {
            newer_than: Some(Duration::from_mins(1)),
            older_than: Some(Duration::from_hours(1)),
            ..Selector::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("--newer-than"), "{e}");
        let e = Selector {
            reasons: vec![" ".into()],
            ..Selector::default()
        }
        .validate()
        .unwrap_err();
        assert!(e.to_string().contains("--reason"), "{e}");
    }
}
