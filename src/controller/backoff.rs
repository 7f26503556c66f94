//! The error backoff: how long to wait before retrying a QueueConsumer whose reconcile failed.
//! Conflicts retry at once; every other error doubles the delay per consecutive failure, from 5 s to
//! 5 min. A successful reconcile clears the count.

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

    /// `key` reconciled: its next failure starts from the base delay again.
    pub(super) fn succeeded(&self, key: &ConsumerKey) {
        self.failures().remove(key);
    }
}

/// Requeue after a failed reconcile: conflicts at once, everything else with exponential backoff.
pub fn error_policy(qc: Arc<QueueConsumer>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(err.reason());
    if err.is_conflict() {
        return Action::requeue(CONFLICT_RETRY);
    }
    let delay = ctx.backoff.failed(ConsumerKey::of(&qc));
    tracing::warn!(queueconsumer = %name_of(&qc), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
