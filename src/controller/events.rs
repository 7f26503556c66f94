//! Events about a QueueConsumer: folded ones (repeats counted into the first one's series), and distinct
//! ones whose notes carry numbers that must not be folded away.

use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};

use crate::api::QueueConsumer;

use super::Context;
use super::apply::FIELD_MANAGER;

/// Event reason of a replica change written by the scaler.
pub const SCALED: &str = "Scaled";

/// Longest note an Event gets (the API server's limit).
const NOTE_MAX: usize = 1024;

impl Context {
    /// An Event whose repeats (same QueueConsumer, type, reason and action) within [`FOLD_TTL`] are
    /// folded into its series (`series.count`, `series.lastObservedTime`) instead of a new Event each:
    /// a condition failing at every poll makes one Event, not one per poll. The note is the first's.
    pub(super) async fn event(
        &self,
        qc: &QueueConsumer,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let action = "Reconcile";
        let regarding = qc.object_ref(&());
        let key = self.folding.key(&regarding, warning, reason, action);
        let now = Timestamp::now();
        if let Some((namespace, name, count)) = self.folding.repeat(key, now) {
            let events: Api<k8s_openapi::api::events::v1::Event> =
                Api::namespaced(self.client.clone(), &namespace);
            let params = PatchParams {
                field_manager: Some(super::apply::FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            match events
                .patch(&name, &params, &Patch::Merge(series_patch(count, now)))
                .await
            {
                Ok(_) => return,
                // Gone (the API server's event TTL, or deleted): a new Event starts the series again.
                Err(kube::Error::Api(s)) if s.code == 404 => self.folding.forget(key),
                Err(e) => {
                    tracing::warn!(error = %e, reason, "could not publish event");
                    return;
                }
            }
        }
        if let Some((namespace, name)) = self
            .create_event(regarding, warning, action, reason, note, now)
            .await
        {
            self.folding.first(key, namespace, name, now);
        }
    }

    /// An Event of its own, never folded into an earlier one. Folding (`Context::event`) keeps the
    /// first note, which would leave "from 1 to 3" on every
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
        self.create_event(
            qc.object_ref(&()),
            warning,
            action,
            reason,
            note,
            Timestamp::now(),
        )
        .await;
    }

    /// Creates an Event about `regarding`; its namespace and name when the API server took it. An Event
    /// is a courtesy: failing to write one is logged and must not fail the reconcile.
    async fn create_event(
        &self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        action: &str,
        reason: &str,
        note: String,
        now: Timestamp,
    ) -> Option<(String, String)> {
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let ev = k8s_openapi::api::events::v1::Event {
            metadata: kube::api::ObjectMeta {
                // Two Events in the same nanosecond still get two names.
                name: Some(format!(
                    "{}.{:x}.{}",
                    regarding.name.as_deref().unwrap_or(FIELD_MANAGER),
                    now.as_nanosecond(),
                    EVENT_SEQ.fetch_add(1, Ordering::Relaxed)
                )),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            action: Some(action.into()),
            reason: Some(reason.into()),
            note: Some(truncate(note, NOTE_MAX)),
            type_: Some(if warning { "Warning" } else { "Normal" }.into()),
            event_time: Some(MicroTime(now)),
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
            Api::namespaced(self.client.clone(), &namespace);
        let params = PostParams {
            field_manager: Some(super::apply::FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match events.create(&params, &ev).await {
            Ok(created) => created.metadata.name.map(|name| (namespace, name)),
            Err(e) => {
                tracing::warn!(error = %e, reason, "could not publish event");
                None
            }
        }
    }
}

static EVENT_SEQ: AtomicU64 = AtomicU64::new(0);

/// How long an Event's repeats fold into it (kube's Recorder folds for 6 minutes too).
pub const FOLD_TTL: SignedDuration = SignedDuration::from_mins(6);

/// The merge patch that counts a repeat into an Event's series.
pub fn series_patch(count: i32, now: Timestamp) -> serde_json::Value {
    serde_json::json!({"series": {"count": count, "lastObservedTime": MicroTime(now)}})
}

/// The Events that repeats fold into, by a hash of what makes a repeat (the object, type, reason and
/// action). kube's Recorder, used before, kept each whole Event and its key (over a kilobyte, in a
/// table that never shrinks: 23.6 MB after a catch-up of 10,000 QueueConsumers, which each get a
/// `DeploymentCreated`); this keeps what the patch needs, and gives the table back as it empties.
#[derive(Default)]
pub struct Folding {
    hasher: RandomState,
    entries: Mutex<Folds>,
}

#[derive(Default)]
struct Folds {
    by_key: HashMap<u64, Folded>,
    pruned: Option<Timestamp>,
}

struct Folded {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

impl Folding {
    /// What makes an Event a repeat of another: the object (uid too: a QueueConsumer deleted and made
    /// again under its name starts afresh), the type, the reason and the action.
    pub fn key(
        &self,
        regarding: &k8s_openapi::api::core::v1::ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
    ) -> u64 {
        self.hasher.hash_one((
            &regarding.namespace,
            &regarding.name,
            &regarding.uid,
            &regarding.kind,
            warning,
            reason,
            action,
        ))
    }

    /// The Event `key` repeats, with its series' new count, when one was made within [`FOLD_TTL`];
    /// None: a new Event is due. Entries past the TTL are dropped at most once a minute.
    pub fn repeat(&self, key: u64, now: Timestamp) -> Option<(String, String, i32)> {
        let mut folds = crate::sync::lock(&self.entries);
        if folds
            .pruned
            .is_none_or(|at| now.duration_since(at) >= SignedDuration::from_mins(1))
        {
            folds
                .by_key
                .retain(|_, f| now.duration_since(f.last) < FOLD_TTL);
            super::shrink_sparse(&mut folds.by_key);
            folds.pruned = Some(now);
        }
        let f = folds.by_key.get_mut(&key)?;
        if now.duration_since(f.last) >= FOLD_TTL {
            folds.by_key.remove(&key);
            return None;
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
        Some((f.namespace.clone(), f.name.clone(), f.count))
    }

    /// A new Event made for `key`: its repeats fold into it from now.
    pub fn first(&self, key: u64, namespace: String, name: String, now: Timestamp) {
        crate::sync::lock(&self.entries).by_key.insert(
            key,
            Folded {
                namespace,
                name,
                count: 1,
                last: now,
            },
        );
    }

    /// The Event `key` folded into is gone.
    pub fn forget(&self, key: u64) {
        crate::sync::lock(&self.entries).by_key.remove(&key);
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ObjectReference;

    /// The table's (entries, capacity).
    fn table(f: &Folding) -> (usize, usize) {
        let folds = crate::sync::lock(&f.entries);
        (folds.by_key.len(), folds.by_key.capacity())
    }

    fn consumer(name: &str, uid: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("QueueConsumer".into()),
            namespace: Some("shop".into()),
            name: Some(name.into()),
            uid: Some(uid.into()),
            ..ObjectReference::default()
        }
    }

    /// Repeats fold into the first Event for the TTL, counting 2, 3, ...; a different object, type,
    /// reason or action is an Event of its own; past the TTL a new Event starts.
    #[test]
    fn repeats_fold_into_the_first_event_for_the_ttl() {
        let f = Folding::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let orders = consumer("orders", "u1");
        let key = f.key(&orders, true, "QueueUnreachable", "Reconcile");
        assert_eq!(f.repeat(key, t0), None);
        f.first(key, "shop".into(), "orders.1".into(), t0);
        let at = |s: i64| t0 + SignedDuration::from_secs(s);
        assert_eq!(
            f.repeat(key, at(15)),
            Some(("shop".into(), "orders.1".into(), 2))
        );
        assert_eq!(
            f.repeat(key, at(30)),
            Some(("shop".into(), "orders.1".into(), 3))
        );
        for other in [
            f.key(
                &consumer("payments", "u2"),
                true,
                "QueueUnreachable",
                "Reconcile",
            ),
            f.key(
                &consumer("orders", "u3"),
                true,
                "QueueUnreachable",
                "Reconcile",
            ),
            f.key(&orders, false, "QueueUnreachable", "Reconcile"),
            f.key(&orders, true, "DeploymentCreated", "Reconcile"),
            f.key(&orders, true, "QueueUnreachable", "Scale"),
        ] {
            assert_ne!(other, key);
            assert_eq!(f.repeat(other, at(31)), None);
        }
        // The TTL counts from the last repeat.
        assert_eq!(
            f.repeat(key, at(30 + 359)),
            Some(("shop".into(), "orders.1".into(), 4))
        );
        assert_eq!(f.repeat(key, at(30 + 359 + 360)), None);
        assert_eq!(table(&f).0, 0);
        f.first(key, "shop".into(), "orders.2".into(), at(800));
        assert_eq!(
            f.repeat(key, at(801)),
            Some(("shop".into(), "orders.2".into(), 2))
        );
        f.forget(key);
        assert_eq!(f.repeat(key, at(802)), None);
    }

    /// After a catch-up's burst of Events the table empties out past the TTL and gives its memory back.
    #[test]
    fn the_table_of_a_burst_is_given_back_past_the_ttl() {
        let f = Folding::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        for i in 0..10_000 {
            let key = f.key(
                &consumer(&format!("qc{i}"), &i.to_string()),
                false,
                "DeploymentCreated",
                "Reconcile",
            );
            f.first(key, "shop".into(), format!("qc{i}.1"), t0);
        }
        let (entries, full) = table(&f);
        assert_eq!(entries, 10_000);
        let later = t0 + FOLD_TTL + SignedDuration::from_secs(61);
        assert_eq!(f.repeat(1, later), None);
        let (entries, capacity) = table(&f);
        assert_eq!(entries, 0);
        assert!(capacity < full / 10, "capacity {capacity} of {full}");
    }

    #[test]
    fn the_series_patch_counts_and_stamps() {
        let t = Timestamp::from_second(1_800_000_000).unwrap();
        assert_eq!(
            series_patch(3, t),
            serde_json::json!({"series": {"count": 3, "lastObservedTime": "2027-01-15T08:00:00.000000Z"}})
        );
    }
}
