//! The controller's counters for `/metrics`: reconciles, errors by reason, writes by kind, and the
//! per-QueueConsumer series. Rendered with the exposition the worker uses too (src/telemetry.rs).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::telemetry::{Exposition, Histogram};

use super::series;
use super::status::WriteCause;

/// Bounds of `qc_reconcile_duration_seconds`: from 5 ms to the reconcile deadline's range.
pub const RECONCILE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// How long reconciles took, from their slot to their result (deadline included).
pub struct ReconcileDuration(pub Histogram);

impl Default for ReconcileDuration {
    fn default() -> Self {
        ReconcileDuration(Histogram::new(RECONCILE_BUCKETS))
    }
}

/// Counters served on /metrics.
#[derive(Default)]
pub struct Metrics {
    pub reconciles: AtomicU64,
    pub reconcile_duration: ReconcileDuration,
    pub reconcile_errors: Mutex<HashMap<&'static str, u64>>,
    pub deployment_applies: AtomicU64,
    /// Writes of `spec.replicas` by the scaler (field manager `qc-operator-scaler`).
    pub scale_writes: AtomicU64,
    /// Writes of `controller.kubernetes.io/pod-deletion-cost` before scale-downs.
    pub deletion_cost_writes: AtomicU64,
    /// Writes of the `processing.maxRate` share annotation on worker pods.
    pub rate_share_writes: AtomicU64,
    /// Status writes by what made each due (`status::WriteCause`); their sum is every status write.
    pub status_write_causes: Mutex<HashMap<WriteCause, u64>>,
    /// Per-QueueConsumer series, from each consumer's last computed status.
    pub consumers: series::Consumers,
}

impl Metrics {
    /// Counts a failed reconcile step by its reason.
    pub(super) fn error(&self, reason: &'static str) {
        let mut m = crate::sync::lock(&self.reconcile_errors);
        *m.entry(reason).or_default() += 1;
    }

    /// Counts a status write by its cause.
    pub(super) fn status_written(&self, cause: WriteCause) {
        *crate::sync::lock(&self.status_write_causes)
            .entry(cause)
            .or_default() += 1;
    }

    /// Status writes of this process, whatever their cause.
    pub fn status_writes(&self) -> u64 {
        crate::sync::lock(&self.status_write_causes).values().sum()
    }

    /// Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut e = Exposition::new();
        self.render_totals(&mut e);
        self.consumers.render(&mut e);
        e.finish()
    }

    /// The process-wide families: all but the per-QueueConsumer series.
    pub fn render_totals(&self, e: &mut Exposition) {
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        e.counter(
            "qc_reconciles_total",
            "QueueConsumer reconciles run.",
            &[(&[], count(&self.reconciles))],
        );
        let mut errors: Vec<(&'static str, u64)> = crate::sync::lock(&self.reconcile_errors)
            .iter()
            .map(|(k, v)| (*k, *v))
            .collect();
        errors.sort_unstable();
        counters_by(
            e,
            "qc_reconcile_errors_total",
            "Failed reconcile steps by reason (the reason names the step: ApplyDeployment, WriteStatus, ...).",
            "reason",
            &errors,
        );
        e.histogram(
            "qc_reconcile_duration_seconds",
            "How long reconciles took once they had a slot, their deadline included.",
            &self.reconcile_duration.0,
        );
        for (name, help, counter) in [
            (
                "qc_deployment_applies_total",
                "Worker Deployments written.",
                &self.deployment_applies,
            ),
            (
                "qc_scale_writes_total",
                "Replica changes written by the scaler.",
                &self.scale_writes,
            ),
            (
                "qc_deletion_cost_writes_total",
                "Pod deletion costs written before scale-downs.",
                &self.deletion_cost_writes,
            ),
            (
                "qc_rate_share_writes_total",
                "Worker pod annotations written with a new share of processing.maxRate.",
                &self.rate_share_writes,
            ),
        ] {
            e.counter(name, help, &[(&[], count(counter))]);
        }
        let mut causes: Vec<(&'static str, u64)> = crate::sync::lock(&self.status_write_causes)
            .iter()
            .map(|(k, v)| (k.label(), *v))
            .collect();
        causes.sort_unstable();
        counters_by(
            e,
            "qc_status_writes_total",
            "QueueConsumer status writes, by the part of status that made each due (generation, conditions, replicas, findings, queue, observed, objective, managed) or counts older than the refresh (counts).",
            "cause",
            &causes,
        );
    }
}

/// A counter family with one label, a sample per value.
fn counters_by(e: &mut Exposition, name: &str, help: &str, label: &str, counts: &[(&str, u64)]) {
    let labels: Vec<[(&str, &str); 1]> = counts.iter().map(|(v, _)| [(label, *v)]).collect();
    let samples: Vec<_> = labels
        .iter()
        .zip(counts)
        .map(|(l, (_, n))| (&l[..], *n))
        .collect();
    e.counter(name, help, &samples);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_counted_by_reason_in_reason_order() {
        let m = Metrics::default();
        m.reconciles.fetch_add(3, Ordering::Relaxed);
        m.error("WriteStatus");
        m.error("ApplyDeployment");
        m.error("WriteStatus");
        let text = m.render();
        assert!(
            text.contains("# TYPE qc_reconciles_total counter\nqc_reconciles_total 3\n"),
            "{text}"
        );
        let apply = text
            .find("qc_reconcile_errors_total{reason=\"ApplyDeployment\"} 1\n")
            .expect(&text);
        let status = text
            .find("qc_reconcile_errors_total{reason=\"WriteStatus\"} 2\n")
            .expect(&text);
        assert!(apply < status, "{text}");
        assert!(text.contains("qc_deletion_cost_writes_total 0\n"), "{text}");
    }

    #[test]
    fn status_writes_are_counted_by_cause() {
        let m = Metrics::default();
        m.status_written(WriteCause::Counts);
        m.status_written(WriteCause::Conditions);
        m.status_written(WriteCause::Counts);
        assert_eq!(m.status_writes(), 3);
        let text = m.render();
        assert!(
            text.contains(
                "# TYPE qc_status_writes_total counter\nqc_status_writes_total{cause=\"conditions\"} 1\nqc_status_writes_total{cause=\"counts\"} 2\n"
            ),
            "{text}"
        );
    }
}
