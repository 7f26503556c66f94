//! Events about a QueueConsumer: folded ones through kube's Recorder, and distinct ones whose notes
//! carry numbers that must not be folded away.

use std::sync::atomic::{AtomicU64, Ordering};

use kube::Resource;
use kube::api::{Api, PostParams};
use kube::runtime::events::{Event, EventType};

use crate::api::QueueConsumer;

use super::Context;
use super::apply::FIELD_MANAGER;

/// Event reason of a replica change written by the scaler.
pub const SCALED: &str = "Scaled";

/// Longest note an Event gets (the API server's limit).
const NOTE_MAX: usize = 1024;

impl Context {
    /// An Event through the Recorder, which folds repeats of a reason into one series.
    pub(super) async fn event(
        &self,
        qc: &QueueConsumer,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(truncate(note, NOTE_MAX)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &qc.object_ref(&())).await {
            // An Event is a courtesy: failing to write one must not fail the reconcile.
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }

    /// An Event of its own, never folded into an earlier one. The Recorder folds repeats of a reason
    /// into one Event's series and keeps the first note, which would leave "from 1 to 3" on every
    /// later replica change, or the first DLQ count on every later `MessagesInDeadLetterQueue`; for
    /// replica changes and condition transitions the numbers in the note are the point.
    pub(super) async fn distinct_event(
        &self,
        qc: &QueueConsumer,
        warning: bool,
        action: &str,
        reason: &str,
        note: String,
    ) {
        let regarding = qc.object_ref(&());
        let now = k8s_openapi::jiff::Timestamp::now();
        let ns = regarding.namespace.clone();
        let ev = k8s_openapi::api::events::v1::Event {
            metadata: kube::api::ObjectMeta {
                // Two Events in the same nanosecond still get two names.
                name: Some(format!(
                    "{}.{:x}.{}",
                    regarding.name.as_deref().unwrap_or(FIELD_MANAGER),
                    now.as_nanosecond(),
                    EVENT_SEQ.fetch_add(1, Ordering::Relaxed)
                )),
                namespace: ns.clone(),
                ..Default::default()
            },
            action: Some(action.into()),
            reason: Some(reason.into()),
            note: Some(truncate(note, NOTE_MAX)),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            event_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                now,
            )),
            regarding: Some(regarding),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        };
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), ns.as_deref().unwrap_or("default"));
        let params = PostParams {
            field_manager: Some(super::apply::FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        if let Err(e) = events.create(&params, &ev).await {
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}

static EVENT_SEQ: AtomicU64 = AtomicU64::new(0);

/// What a tenant reads in an Event: no principal ARN (`aws::without_principals`), within the limit.
fn truncate(s: String, max: usize) -> String {
    let mut s = crate::aws::scrub_principals(s);
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}
