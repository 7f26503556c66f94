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

    pub fn render(&self, e: &mut Exposition) {
        let entries = self.lock().clone();
        for (i, (name, help)) in GAUGES.iter().enumerate() {
            let samples: Vec<([(&str, &str); 2], f64)> = entries
                .iter()
                .filter_map(|((ns, qc), s)| {
                    let v = s.values.get(i).copied().flatten()?;
                    Some((
                        [("namespace", ns.as_str()), ("queueconsumer", qc.as_str())],
                        v,
                    ))
                })
                .collect();
            let refs: Vec<(&[(&str, &str)], f64)> =
                samples.iter().map(|(l, v)| (&l[..], *v)).collect();
            e.gauge_f64(name, help, &refs);
        }
        let labels: Vec<([(&str, &str); 4], i64)> = entries
            .iter()
            .flat_map(|((ns, qc), s)| {
                s.conditions.iter().map(move |(t, st)| {
                    (
                        [
                            ("namespace", ns.as_str()),
                            ("queueconsumer", qc.as_str()),
                            ("type", t.as_str()),
                            ("status", st.as_str()),
                        ],
                        1,
                    )
                })
            })
            .collect();
        let refs: Vec<(&[(&str, &str)], i64)> = labels.iter().map(|(l, v)| (&l[..], *v)).collect();
        e.gauge(CONDITION.0, CONDITION.1, &refs);
    }
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
}
