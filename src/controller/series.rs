//! Per-QueueConsumer series on the controller's /metrics (labels `namespace`, `queueconsumer`): the
//! numbers of its last computed status (fresh at every poll, also when the status write of busy counts
//! is held), one family per quantity. A consumer's series go with it.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

use crate::api::{QueueConsumerSpec, QueueConsumerStatus};
use crate::telemetry::Exposition;

/// Every per-consumer family: (name, help). Exported even when no consumer exists (HELP and TYPE
/// only), so dashboards and alert rules can be checked against this list.
pub const GAUGES: &[(&str, &str)] = &[
    (
        "qc_queue_messages_visible",
        "Messages available in the source queue (ApproximateNumberOfMessages).",
    ),
    (
        "qc_queue_messages_in_flight",
        "Messages received and not yet deleted (ApproximateNumberOfMessagesNotVisible).",
    ),
    (
        "qc_queue_messages_delayed",
        "Messages delayed in the source queue (ApproximateNumberOfMessagesDelayed).",
    ),
    (
        "qc_queue_oldest_message_age_seconds",
        "Age of the oldest message in the source queue (CloudWatch ApproximateAgeOfOldestMessage).",
    ),
    (
        "qc_dead_letter_messages_visible",
        "Messages in the dead-letter queue.",
    ),
    (
        "qc_dead_letter_oldest_message_age_seconds",
        "Age of the oldest message in the dead-letter queue (CloudWatch).",
    ),
    (
        "qc_replicas_desired",
        "Worker replicas the scaler asks for.",
    ),
    ("qc_replicas_current", "Worker replicas the Deployment has."),
    (
        "qc_scaling_max_backlog_age_seconds",
        "Declared scaling.maxBacklogAge: the visible backlog should drain within it.",
    ),
    (
        "qc_processing_declared_p99_seconds",
        "Declared processing.p99 per message.",
    ),
    (
        "qc_processing_observed_p99_seconds",
        "P99 of the handler time per message, observed on the worker pods over the window.",
    ),
    (
        "qc_processing_observed_mean_seconds",
        "Mean handler time per message, observed on the worker pods over the window.",
    ),
    (
        "qc_processing_observed_messages_per_second",
        "Messages finished per second by all worker pods, over the window.",
    ),
    (
        "qc_workers_breaker_open_ratio",
        "Share of the scraped worker pods whose outage breaker is open (intake paused: the handler's dependency is failing); above 0.5 the scaler holds replicas.",
    ),
    (
        "qc_objective_dwell_p99_seconds",
        "Declared scaling.objective.dwellP99: 99 % of the messages should leave the queue within it of their send.",
    ),
    (
        "qc_objective_observed_dwell_p99_seconds",
        "P99 of the messages' dwell (send to deletion), observed on the worker pods over the window (status.objective).",
    ),
    (
        "qc_objective_burn_rate",
        "The dwell objective's error budget burn rate over the window: the share of messages over dwellP99 divided by the 1 % allowed.",
    ),
];

/// One series per condition, with its status as a label: value 1.
pub const CONDITION: (&str, &str) = (
    "qc_condition",
    "QueueConsumer conditions: 1 for the condition's current status (labels type, status).",
);

/// A consumer's numbers, as of its last status write.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Series {
    pub uid: String,
    /// Values in the order of `GAUGES`; None leaves the series out.
    pub values: Vec<Option<f64>>,
    /// (type, status) of each condition.
    pub conditions: Vec<(String, String)>,
}

impl Series {
    pub fn from_status(uid: &str, spec: &QueueConsumerSpec, s: &QueueConsumerStatus) -> Series {
        let n = |v: Option<i64>| v.map(|v| v as f64);
        let q = s.queue.as_ref();
        let dl = s.dead_letter.as_ref();
        let o = s.observed.as_ref();
        Series {
            uid: uid.to_string(),
            values: vec![
                n(q.and_then(|q| q.visible)),
                n(q.and_then(|q| q.in_flight)),
                n(q.and_then(|q| q.delayed)),
                n(q.and_then(|q| q.oldest_age_seconds)),
                n(dl.and_then(|d| d.visible)),
                n(dl.and_then(|d| d.oldest_age_seconds)),
                s.desired_replicas.map(f64::from),
                s.replicas.map(f64::from),
                Some(spec.scaling.max_backlog_age.as_secs_f64()),
                Some(spec.processing.p99.as_secs_f64()),
                o.and_then(|o| o.p99_seconds),
                o.and_then(|o| o.mean_seconds),
                o.and_then(|o| o.messages_per_second),
                o.and_then(|o| {
                    let pods = o.pods.filter(|p| *p > 0)?;
                    Some(f64::from(o.breaker_open.unwrap_or(0)) / f64::from(pods))
                }),
                spec.scaling
                    .objective
                    .as_ref()
                    .map(|o| o.dwell_p99.as_secs_f64()),
                s.objective.as_ref().and_then(|o| o.dwell_p99_seconds),
                s.objective.as_ref().and_then(|o| o.burn_rate),
            ],
            conditions: s
                .conditions
                .iter()
                .map(|c| (c.type_.clone(), c.status.clone()))
                .collect(),
        }
    }
}

/// Series of every consumer, keyed by (namespace, name).
#[derive(Default)]
pub struct Consumers {
    entries: Mutex<BTreeMap<(String, String), Series>>,
}

impl Consumers {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<(String, String), Series>> {
        crate::sync::lock(&self.entries)
    }

    pub fn set(&self, namespace: &str, name: &str, series: Series) {
        self.lock()
            .insert((namespace.to_string(), name.to_string()), series);
    }

    pub fn remove(&self, namespace: &str, name: &str) {
        self.lock()
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Drop the series of consumers `exists(namespace, name, uid)` no longer finds.
    pub fn retain(&self, exists: impl Fn(&str, &str, &str) -> bool) {
        self.lock().retain(|(ns, name), s| exists(ns, name, &s.uid));
    }

    /// Every family at once (tests; `/metrics` renders them in parts, [`Consumers::render_part`]).
    pub fn render(&self, e: &mut Exposition) {
        let mut cursor = Cursor::default();
        while self.render_part(e, &mut cursor, usize::MAX) {}
    }

    /// Renders the samples of at most `max` consumers of the family `cursor` is at (its HELP and TYPE
    /// first, when the family begins), and moves the cursor past them; false once every family is out.
    /// The lock is held for one part only, so reconciles are not held up by a scrape; a consumer
    /// created or deleted between two parts is then in some families of that scrape and not others.
    pub fn render_part(&self, e: &mut Exposition, cursor: &mut Cursor, max: usize) -> bool {
        use std::ops::Bound;
        let Some((name, help)) = GAUGES
            .get(cursor.family)
            .copied()
            .or((cursor.family == GAUGES.len()).then_some(CONDITION))
        else {
            return false;
        };
        if cursor.after.is_none() {
            e.gauge_header(name, help);
        }
        let entries = self.lock();
        let from = match cursor.after.take() {
            Some(key) => Bound::Excluded(key),
            None => Bound::Unbounded,
        };
        let mut taken = 0;
        let mut last = None;
        for ((ns, qc), s) in entries.range((from, Bound::Unbounded)).take(max) {
            taken += 1;
            last = Some((ns, qc));
            if cursor.family < GAUGES.len() {
                if let Some(v) = s.values.get(cursor.family).copied().flatten() {
                    e.sample(name, &[("namespace", ns), ("queueconsumer", qc)], v);
                }
            } else {
                for (t, st) in &s.conditions {
                    e.sample(
                        name,
                        &[
                            ("namespace", ns),
                            ("queueconsumer", qc),
                            ("type", t),
                            ("status", st),
                        ],
                        1,
                    );
                }
            }
        }
        match last {
            Some((ns, qc)) if taken == max => cursor.after = Some((ns.clone(), qc.clone())),
            _ => cursor.family += 1,
        }
        true
    }
}

/// Where a rendering of [`Consumers`] in parts stands: the family, and the last consumer rendered in it.
#[derive(Debug, Default)]
pub struct Cursor {
    family: usize,
    after: Option<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_follow_status_and_go_with_their_consumer() {
        let spec: QueueConsumerSpec = serde_json::from_value(serde_json::json!({
            "queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/q"},
            "processing": {"p99": "2s"}, "handler": {"http": {}}
        }))
        .unwrap();
        let status: QueueConsumerStatus = serde_json::from_value(serde_json::json!({
            "queue": {"visible": 7, "oldestAgeSeconds": 40},
            "observed": {"p99Seconds": 2.5, "pods": 4, "breakerOpen": 1},
            "replicas": 2, "desiredReplicas": 3,
            "conditions": [{"type": "Ready", "status": "False", "reason": "X", "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }))
        .unwrap();
        let c = Consumers::default();
        c.set("shop", "orders", Series::from_status("u1", &spec, &status));
        let mut e = Exposition::new();
        c.render(&mut e);
        let text = e.finish();
        for line in [
            "qc_queue_messages_visible{namespace=\"shop\",queueconsumer=\"orders\"} 7\n",
            "qc_queue_oldest_message_age_seconds{namespace=\"shop\",queueconsumer=\"orders\"} 40\n",
            "qc_processing_observed_p99_seconds{namespace=\"shop\",queueconsumer=\"orders\"} 2.5\n",
            "qc_processing_declared_p99_seconds{namespace=\"shop\",queueconsumer=\"orders\"} 2\n",
            "qc_workers_breaker_open_ratio{namespace=\"shop\",queueconsumer=\"orders\"} 0.25\n",
            "qc_replicas_desired{namespace=\"shop\",queueconsumer=\"orders\"} 3\n",
            "qc_condition{namespace=\"shop\",queueconsumer=\"orders\",type=\"Ready\",status=\"False\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        // Unknown values are left out, not reported as 0.
        assert!(!text.contains("qc_queue_messages_in_flight{"), "{text}");
        c.retain(|_, _, uid| uid != "u1");
        let mut e = Exposition::new();
        c.render(&mut e);
        assert!(!e.finish().contains("queueconsumer=\"orders\""));
    }

    /// `/metrics` renders the series in parts of a few consumers: the parts joined are the exposition
    /// rendered at once, every family whole and once, and no part holds more consumers than asked.
    #[test]
    fn series_rendered_in_parts_are_the_series_rendered_at_once() {
        let spec: QueueConsumerSpec = serde_json::from_value(serde_json::json!({
            "queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/q"},
            "processing": {"p99": "2s"}, "handler": {"http": {}}
        }))
        .unwrap();
        let c = Consumers::default();
        for i in 0..7 {
            let status: QueueConsumerStatus = serde_json::from_value(serde_json::json!({
                "queue": {"visible": i},
                "replicas": i,
                "conditions": [
                    {"type": "Ready", "status": "True", "reason": "X", "message": "",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"},
                    {"type": "QueueReachable", "status": "False", "reason": "X", "message": "",
                     "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }))
            .unwrap();
            c.set(
                &format!("ns{}", i % 2),
                &format!("qc{i}"),
                Series::from_status("u", &spec, &status),
            );
        }
        let mut whole = Exposition::new();
        c.render(&mut whole);
        let whole = whole.finish();
        for max in [1, 2, 3, 7, 8] {
            let mut cursor = Cursor::default();
            let mut parts = Vec::new();
            loop {
                let mut e = Exposition::new();
                if !c.render_part(&mut e, &mut cursor, max) {
                    break;
                }
                parts.push(e.finish());
            }
            assert_eq!(parts.concat(), whole, "parts of {max}");
            for part in &parts {
                let consumers: std::collections::BTreeSet<&str> = part
                    .lines()
                    .filter_map(|l| l.split("queueconsumer=\"").nth(1))
                    .filter_map(|rest| rest.split('"').next())
                    .collect();
                assert!(
                    consumers.len() <= max,
                    "{} consumers in a part of {max}: {part}",
                    consumers.len()
                );
            }
        }
        for (name, _) in GAUGES.iter().chain([&CONDITION]) {
            assert_eq!(
                whole.matches(&format!("# TYPE {name} gauge\n")).count(),
                1,
                "{name}"
            );
        }
        assert_eq!(whole.matches("qc_condition{").count(), 14);
        assert_eq!(whole.matches("qc_queue_messages_visible{").count(), 7);
    }
}
