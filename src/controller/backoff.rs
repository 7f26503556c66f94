//! The error backoff: how long to wait before retrying a QueueConsumer whose reconcile failed.
//! Conflicts retry at once; every other error doubles the delay per consecutive failure, from 5 s to
//! 5 min, except that an unavailable API server is retried within the poll interval. A successful
//! reconcile clears the count.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kube::runtime::controller::Action;

use crate::api::QueueConsumer;

use super::{ConsumerKey, Context, Error, name_of};

/// Base and cap of the error backoff.
const BACKOFF_BASE: Duration = Duration::from_secs(5);
const BACKOFF_MAX: Duration = Duration::from_mins(5);
const CONFLICT_RETRY: Duration = Duration::from_secs(1);

/// Consecutive failed reconciles per QueueConsumer.
#[derive(Default)]
pub struct Backoff {
    failures: Mutex<HashMap<ConsumerKey, u32>>,
}

impl Backoff {
    fn failures(&self) -> MutexGuard<'_, HashMap<ConsumerKey, u32>> {
        crate::sync::lock(&self.failures)
    }

    /// One more failure of `key`: the delay before its next try.
    fn failed(&self, key: ConsumerKey) -> Duration {
        let mut failures = self.failures();
        let n = failures.entry(key).or_default();
        *n = n.saturating_add(1);
        BACKOFF_BASE
            .saturating_mul(1u32 << (*n - 1).min(10))
            .min(BACKOFF_MAX)
    }

    /// The delay before `key`'s next try after `err`. An unavailable API server is tried again every poll
    /// interval and not counted: a long outage must not leave every QueueConsumer at the longest delay
    /// for its first other error after it (kube-apiserver answers 403 until its RBAC caches have synced).
    fn after(&self, key: ConsumerKey, err: &Error, poll: Duration) -> Duration {
        if err.is_api_unavailable() {
            return poll.max(CONFLICT_RETRY);
        }
        self.failed(key)
    }

    /// `key` reconciled: its next failure starts from the base delay again.
    pub(super) fn succeeded(&self, key: &ConsumerKey) {
        self.failures().remove(key);
    }
}

/// Requeue after a failed reconcile: conflicts at once, everything else with exponential backoff. While the
/// API server is unavailable (restarting, upgrading) it is tried again every poll interval: the outage is
/// the cluster's, not this QueueConsumer's, and once the server is back every QueueConsumer is current
/// again within seconds instead of after minutes of doubled delays (tests/k8s_failover.rs: 71 s before).
pub fn error_policy(qc: Arc<QueueConsumer>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(err.reason());
    if err.is_conflict() {
        return Action::requeue(CONFLICT_RETRY);
    }
    let poll = qc.spec.scaling.poll_interval.as_std();
    let delay = ctx.backoff.after(ConsumerKey::of(&qc), err, poll);
    tracing::warn!(queueconsumer = %name_of(&qc), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> Error {
        Error::ReadDeployment(kube::Error::Api(Box::new(
            kube::core::Status::failure("refused", "Refused").with_code(code),
        )))
    }

    #[test]
    fn an_unavailable_api_server_is_retried_every_poll_and_not_counted() {
        let b = Backoff::default();
        let qc: QueueConsumer = serde_json::from_value(serde_json::json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "u1"},
            "spec": {"queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/q"},
                     "processing": {"p99": "1s"}, "handler": {"http": {}}}
        }))
        .unwrap();
        let key = ConsumerKey::of(&qc);
        let poll = Duration::from_secs(15);
        for _ in 0..20 {
            assert_eq!(b.after(key.clone(), &api(503), poll), poll);
        }
        // The first other error after the outage starts from the base delay.
        assert_eq!(b.after(key.clone(), &api(403), poll), BACKOFF_BASE);
        assert_eq!(b.after(key.clone(), &api(403), poll), BACKOFF_BASE * 2);
        assert_eq!(b.after(key, &api(504), Duration::ZERO), CONFLICT_RETRY);
    }
}
