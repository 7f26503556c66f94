//! What wakes a reconcile besides its own poll. A QueueConsumer is reconciled on its slot of every
//! poll interval ([`super::spread`]); between polls only a change the controller did not make itself
//! and that it would act on triggers one: a new generation (spec), deletion, a redrive request, and
//! for its Deployments a change of rollout progress or a deletion. The controller's own writes (status,
//! finalizer, Deployment apply, replicas) come back as watch events, and without this filter each of
//! them reconciled the QueueConsumer again: about 11 reconciles each in a 1,000-QueueConsumer catch-up.
//!
//! The fingerprints are pure; [`changes`] is the stream adapter that keeps the last one per object.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use futures::{Stream, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Resource;
use kube::runtime::watcher;

use crate::api::{QueueConsumer, REDRIVE_REQUEST_ANNOTATION};

fn hash<T: Hash>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

/// What of a QueueConsumer a reconcile between polls must answer: its generation (the API server
/// bumps it on every spec change, and on deletion), deletion itself, and the redrive request
/// annotation. Status, finalizers and managed fields (the controller's own writes) are left out. An
/// object without a generation (a server that does not keep one) falls back to its resourceVersion:
/// every change then triggers, as without the filter.
pub fn consumer_fingerprint(qc: &QueueConsumer) -> u64 {
    let meta = qc.meta();
    let generation = match meta.generation {
        Some(g) => Err(g),
        None => Ok(meta.resource_version.clone()),
    };
    let redrive = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(REDRIVE_REQUEST_ANNOTATION));
    hash(&(generation, meta.deletion_timestamp.is_some(), redrive))
}

/// What of an owned Deployment a reconcile between polls must answer: rollout progress as the
/// Deployment controller reports it (replica counts, condition types, statuses and reasons: Ready and
/// RolloutStalled come from them) and deletion. Its spec and generation are left out: the controller's
/// own applies and replica writes change them, and a hand edit is undone at the next poll.
/// `observedGeneration` is left out too: it follows the controller's own applies.
pub fn deployment_fingerprint(d: &Deployment) -> u64 {
    let status = d.status.as_ref().map(|s| {
        let conditions: Vec<_> = s
            .conditions
            .iter()
            .flatten()
            .map(|c| (&c.type_, &c.status, &c.reason))
            .collect();
        (
            s.replicas,
            s.ready_replicas,
            s.available_replicas,
            s.updated_replicas,
            s.unavailable_replicas,
            conditions,
        )
    });
    hash(&(d.metadata.deletion_timestamp.is_some(), status))
}

/// Object identity across a watch: uid, else namespace/name.
fn identity<K: Resource>(obj: &K) -> String {
    let meta = obj.meta();
    match &meta.uid {
        Some(uid) => uid.clone(),
        None => format!(
            "{}/{}",
            meta.namespace.as_deref().unwrap_or_default(),
            meta.name.as_deref().unwrap_or_default()
        ),
    }
}

/// What a watch's filter compares an object it has not seen before with.
#[derive(Clone, Copy, Debug)]
pub enum FirstSight {
    /// Every new object passes (a new QueueConsumer is reconciled at once).
    Passes,
    /// A new object passes only when its fingerprint differs from this one: the fingerprint of a
    /// Deployment as the controller creates it (no status yet), so its own create wakes nothing
    /// while one found with a rollout already reported does.
    Differs(u64),
}

/// The fingerprint of a Deployment the controller just created: no status, not being deleted.
pub fn created_deployment() -> FirstSight {
    FirstSight::Differs(deployment_fingerprint(&Deployment::default()))
}

/// Last fingerprint per object, and what a relist has seen so far (to forget objects deleted while
/// the watch was down).
struct Seen {
    last: HashMap<String, u64>,
    relisted: Option<HashSet<String>>,
    first: FirstSight,
}

impl Seen {
    /// Whether `obj` is new or changed in what `fingerprint` hashes.
    fn changed<K: Resource>(&mut self, obj: &K, fingerprint: fn(&K) -> u64) -> bool {
        let id = identity(obj);
        let fp = fingerprint(obj);
        if let Some(r) = self.relisted.as_mut() {
            r.insert(id.clone());
        }
        match (self.last.insert(id, fp), self.first) {
            (Some(before), _) => before != fp,
            (None, FirstSight::Passes) => true,
            (None, FirstSight::Differs(base)) => base != fp,
        }
    }
}

/// The objects of a watch whose fingerprint changed (new objects as `first` says), and every deleted
/// one. Restarts of the watch (relists) pass only what changed while it was down, so a watch that
/// reconnects does not reconcile every QueueConsumer at once.
pub fn changes<K, S>(
    events: S,
    fingerprint: fn(&K) -> u64,
    first: FirstSight,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send
where
    K: Resource + Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send,
{
    let mut seen = Seen {
        last: HashMap::new(),
        relisted: None,
        first,
    };
    events.filter_map(move |event| {
        let out = match event {
            Err(e) => Some(Err(e)),
            Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                seen.changed(&obj, fingerprint).then_some(Ok(obj))
            }
            Ok(watcher::Event::Delete(obj)) => {
                seen.last.remove(&identity(&obj));
                Some(Ok(obj))
            }
            Ok(watcher::Event::Init) => {
                seen.relisted = Some(HashSet::new());
                None
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(listed) = seen.relisted.take() {
                    seen.last.retain(|id, _| listed.contains(id));
                }
                None
            }
        };
        std::future::ready(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::{DeploymentCondition, DeploymentStatus};
    use serde_json::json;

    fn qc(generation: i64, rv: &str) -> QueueConsumer {
        serde_json::from_value(json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": "a", "namespace": "n", "uid": "u1", "generation": generation, "resourceVersion": rv},
            "spec": {
                "queue": {"url": "https://sqs.us-east-1.amazonaws.com/123456789012/q"},
                "processing": {"p99": "2s"},
                "handler": {"http": {"port": 8080}},
                "template": {"spec": {"containers": [{"name": "app", "image": "app:1"}]}}
            }
        }))
        .unwrap()
    }

    #[test]
    fn own_writes_to_a_queueconsumer_do_not_change_its_fingerprint() {
        let a = qc(3, "10");
        let mut b = qc(3, "11");
        b.status = Some(crate::api::QueueConsumerStatus::default());
        b.metadata.finalizers = Some(vec!["x".into()]);
        b.metadata.annotations = Some([("other".to_string(), "1".to_string())].into());
        assert_eq!(consumer_fingerprint(&a), consumer_fingerprint(&b));
    }

    #[test]
    fn spec_deletion_and_redrive_requests_change_it() {
        let a = qc(3, "10");
        assert_ne!(consumer_fingerprint(&a), consumer_fingerprint(&qc(4, "10")));
        let mut deleting = qc(3, "11");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_ne!(consumer_fingerprint(&a), consumer_fingerprint(&deleting));
        let mut redrive = qc(3, "11");
        redrive.metadata.annotations =
            Some([(REDRIVE_REQUEST_ANNOTATION.to_string(), "t1".to_string())].into());
        assert_ne!(consumer_fingerprint(&a), consumer_fingerprint(&redrive));
        let mut again = redrive.clone();
        again.metadata.annotations =
            Some([(REDRIVE_REQUEST_ANNOTATION.to_string(), "t2".to_string())].into());
        assert_ne!(consumer_fingerprint(&redrive), consumer_fingerprint(&again));
    }

    #[test]
    fn without_a_generation_every_change_counts() {
        let mut a = qc(1, "10");
        a.metadata.generation = None;
        let mut b = a.clone();
        b.metadata.resource_version = Some("11".into());
        assert_ne!(consumer_fingerprint(&a), consumer_fingerprint(&b));
    }

    fn deployment(replicas: i32, available: Option<&str>) -> Deployment {
        let mut d = Deployment::default();
        d.metadata.uid = Some("d1".into());
        d.metadata.generation = Some(1);
        d.status = Some(DeploymentStatus {
            replicas: Some(replicas),
            observed_generation: Some(1),
            conditions: available.map(|s| {
                vec![DeploymentCondition {
                    type_: Some("Available".into()),
                    status: Some(s.into()),
                    reason: Some("MinimumReplicasAvailable".into()),
                    message: Some("m".into()),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        d
    }

    #[test]
    fn own_applies_to_a_deployment_do_not_change_its_fingerprint() {
        let a = deployment(2, Some("True"));
        let mut b = a.clone();
        b.metadata.generation = Some(2);
        b.spec.replicas = Some(5);
        b.metadata.annotations = Some([("fp".to_string(), "x".to_string())].into());
        b.status.as_mut().unwrap().observed_generation = Some(2);
        assert_eq!(deployment_fingerprint(&a), deployment_fingerprint(&b));
    }

    #[test]
    fn rollout_progress_changes_it() {
        let a = deployment(2, Some("True"));
        assert_ne!(
            deployment_fingerprint(&a),
            deployment_fingerprint(&deployment(3, Some("True")))
        );
        assert_ne!(
            deployment_fingerprint(&a),
            deployment_fingerprint(&deployment(2, Some("False")))
        );
        assert_ne!(
            deployment_fingerprint(&a),
            deployment_fingerprint(&deployment(2, None))
        );
    }

    fn run(events: Vec<watcher::Event<QueueConsumer>>) -> Vec<String> {
        let stream = futures::stream::iter(events.into_iter().map(Ok));
        let out: Vec<_> = futures::executor::block_on(
            changes(stream, consumer_fingerprint, FirstSight::Passes).collect::<Vec<_>>(),
        );
        out.into_iter()
            .map(|r| r.unwrap().metadata.resource_version.unwrap())
            .collect()
    }

    #[test]
    fn the_stream_passes_new_changed_and_deleted_objects_only() {
        use watcher::Event::*;
        let passed = run(vec![
            Init,
            InitApply(qc(1, "1")),
            InitDone,
            Apply(qc(1, "2")), // status written: filtered
            Apply(qc(2, "3")), // spec changed
            Apply(qc(2, "4")), // finalizer added: filtered
            Delete(qc(2, "5")),
            Apply(qc(1, "6")), // recreated under the same uid (tests): new again
        ]);
        assert_eq!(passed, ["1", "3", "5", "6"]);
    }

    #[test]
    fn a_deployment_the_controller_just_created_passes_only_once_it_has_a_status() {
        use watcher::Event::*;
        let mut created = deployment(0, None);
        created.status = None;
        let reported = deployment(1, Some("True"));
        let mut other = deployment(1, Some("True"));
        other.metadata.uid = Some("d2".into());
        let stream = futures::stream::iter(
            vec![
                Apply(created.clone()),  // our create: nothing to answer
                Apply(created.clone()),  // our replicas write
                Apply(reported.clone()), // the Deployment controller reports
                InitApply(other),        // found with a rollout already reported
                Delete(reported),
            ]
            .into_iter()
            .map(Ok),
        );
        let passed: Vec<_> = futures::executor::block_on(
            changes(stream, deployment_fingerprint, created_deployment()).collect::<Vec<_>>(),
        );
        let uids: Vec<_> = passed
            .into_iter()
            .map(|d| d.unwrap().metadata.uid.unwrap())
            .collect();
        assert_eq!(uids, ["d1", "d2", "d1"]);
    }

    #[test]
    fn a_relist_passes_only_what_changed_while_the_watch_was_down() {
        use watcher::Event::*;
        let mut other = qc(1, "1");
        other.metadata.uid = Some("u2".into());
        let mut other_again = other.clone();
        other_again.metadata.resource_version = Some("9".into());
        let passed = run(vec![
            Init,
            InitApply(qc(1, "1")),
            InitApply(other),
            InitDone,
            Init,
            InitApply(qc(1, "7")), // only a status write while down: filtered
            InitDone,              // u2 was deleted while down: forgotten
            Apply(other_again),    // so its return is new
        ]);
        assert_eq!(passed, ["1", "1", "9"]);
    }
}
