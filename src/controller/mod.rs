//! The reconciler: observe → validate → build → apply → scale → status for each QueueConsumer, plus the
//! DLQ alarm's finalizer. Orchestration only; decisions live in pure modules (validate, render, pipeline,
//! scaling, status).

pub mod alarm;
pub mod apply;
pub mod key;
pub mod metrics;
pub mod observe;
pub mod pipeline;
pub mod plan;
pub mod redrive;
pub mod run;
pub mod scale;
pub mod series;
pub mod spread;
pub mod status;
pub mod triggers;
pub mod workers;

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Resource, ResourceExt};
use serde_json::json;

use crate::api::{API_VERSION, KIND, QueueConsumer};
use crate::aws::ObserveError;
use crate::aws::cloudwatch::{AlarmDeletion, CloudWatchError};
use crate::aws::endpoints::AllowedEndpoints;
use crate::render::RenderOptions;

use self::alarm::AlarmChange;
use self::apply::{Applied, FIELD_MANAGER, SCALER_FIELD_MANAGER};
pub use self::key::ConsumerKey;
pub use self::metrics::Metrics;
use self::observe::{AwsProvider, FactsCache};
use self::pipeline::Rollout;
use self::pipeline::{ReplicaDecision, alarm_name};
use self::scale::Histories;
use self::status::{StatusInputs, Workers};

/// One variant per pipeline step that can fail; each becomes a Warning Event and a requeue.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("queueconsumer has no namespace")]
    MissingNamespace,
    #[error("read queue: {0}")]
    ObserveQueue(#[source] ObserveError),
    #[error("read deployment: {0}")]
    ReadDeployment(#[source] kube::Error),
    #[error("apply deployment: {0}")]
    ApplyDeployment(#[source] kube::Error),
    #[error("scale deployment: {0}")]
    ScaleDeployment(#[source] kube::Error),
    #[error("write status: {0}")]
    WriteStatus(#[source] kube::Error),
    #[error("add finalizer: {0}")]
    AddFinalizer(#[source] kube::Error),
    #[error("remove finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("encode patch: {0}")]
    EncodePatch(#[source] serde_json::Error),
    #[error("delete dead-letter alarm: {0}")]
    DeleteAlarm(#[source] CloudWatchError),
}

impl Error {
    /// CamelCase reason for Events and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::MissingNamespace => "MissingNamespace",
            Error::ObserveQueue(e) => e.reason(),
            Error::ReadDeployment(_) => "ReadDeploymentFailed",
            Error::ApplyDeployment(_) => "ApplyDeploymentFailed",
            Error::ScaleDeployment(_) => "ScaleDeploymentFailed",
            Error::WriteStatus(_) => "WriteStatusFailed",
            Error::AddFinalizer(_) => "AddFinalizerFailed",
            Error::RemoveFinalizer(_) => "RemoveFinalizerFailed",
            Error::EncodePatch(_) => "EncodePatchFailed",
            Error::DeleteAlarm(_) => "DeleteAlarmFailed",
        }
    }

    /// Another writer got there first (409, or a JSON-patch test that no longer holds): retry soon
    /// with fresh state rather than back off.
    pub fn is_conflict(&self) -> bool {
        let (Error::ReadDeployment(kube_err)
        | Error::ApplyDeployment(kube_err)
        | Error::ScaleDeployment(kube_err)
        | Error::WriteStatus(kube_err)
        | Error::AddFinalizer(kube_err)
        | Error::RemoveFinalizer(kube_err)) = self
        else {
            return false;
        };
        matches!(kube_err, kube::Error::Api(s) if s.code == 409 || (s.code == 422 && matches!(self, Error::AddFinalizer(_) | Error::RemoveFinalizer(_))))
    }
}

/// Shared by every reconcile.
pub struct Context {
    pub client: kube::Client,
    pub aws: Arc<dyn AwsProvider>,
    pub facts: FactsCache,
    /// The scaler's sample history per QueueConsumer.
    pub scaling: Histories,
    /// DLQ redrives this process runs itself.
    pub redrives: redrive::Redrives,
    /// The worker pods' scrapes per QueueConsumer.
    pub workers: workers::Windows,
    pub render: RenderOptions,
    /// Endpoints a QueueConsumer may name in `spec.queue.endpoint` (AWS's own only, unless the
    /// operator allows more).
    pub endpoints: AllowedEndpoints,
    pub recorder: Recorder,
    reporter: Reporter,
    pub metrics: Metrics,
    failures: Mutex<HashMap<ConsumerKey, u32>>,
    /// The watch caches of QueueConsumers, to drop the series of deleted ones.
    stores: Mutex<Vec<Store<QueueConsumer>>>,
}

impl Context {
    pub fn new(
        client: kube::Client,
        aws: Arc<dyn AwsProvider>,
        render: RenderOptions,
        instance: Option<String>,
    ) -> Self {
        let reporter = Reporter {
            controller: FIELD_MANAGER.into(),
            instance,
        };
        let recorder = Recorder::new(client.clone(), reporter.clone());
        Context {
            client,
            aws,
            facts: FactsCache::new(),
            scaling: Histories::new(),
            redrives: redrive::Redrives::new(),
            workers: workers::Windows::new(),
            render,
            endpoints: AllowedEndpoints::aws_only(),
            recorder,
            reporter,
            metrics: Metrics::default(),
            failures: Mutex::new(HashMap::new()),
            stores: Mutex::new(Vec::new()),
        }
    }

    /// Remember a controller's QueueConsumer cache: series of consumers no cache holds are dropped.
    pub fn watch_store(&self, store: Store<QueueConsumer>) {
        match self.stores.lock() {
            Ok(mut s) => s.push(store),
            Err(p) => p.into_inner().push(store),
        }
    }

    /// Drop the series of QueueConsumers that were deleted (a consumer without finalizer is not
    /// reconciled again after its deletion). Without a cache (reconcile called directly), nothing is.
    pub fn forget_deleted_consumers(&self) {
        let stores = match self.stores.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        };
        if stores.is_empty() {
            return;
        }
        self.metrics.consumers.retain(|ns, name, uid| {
            stores.iter().any(|s| {
                s.get(&ObjectRef::new(name).within(ns))
                    .is_some_and(|q| q.metadata.uid.as_deref().unwrap_or("") == uid)
            })
        });
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<ConsumerKey, u32>> {
        match self.failures.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        }
    }

    async fn event(&self, qc: &QueueConsumer, warning: bool, reason: &str, note: String) {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(truncate(note, 1024)),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &qc.object_ref(&())).await {
            // An Event is a courtesy: failing to write one must not fail the reconcile.
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}

impl Context {
    /// An Event of its own, never folded into an earlier one. The Recorder folds repeats of a reason
    /// into one Event's series and keeps the first note, which would leave "from 1 to 3" on every
    /// later replica change, or the first DLQ count on every later `MessagesInDeadLetterQueue`; for
    /// replica changes and condition transitions the numbers in the note are the point.
    async fn distinct_event(
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
            note: Some(truncate(note, 1024)),
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
        if let Err(e) = events.create(&PostParams::default(), &ev).await {
            tracing::warn!(error = %e, reason, "could not publish event");
        }
    }
}

static EVENT_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// namespace/name, for log lines.
fn name_of(qc: &QueueConsumer) -> String {
    format!("{}/{}", qc.namespace().unwrap_or_default(), qc.name_any())
}

/// Event reason of a replica change written by the scaler.
pub const SCALED: &str = "Scaled";

/// Base and cap of the error backoff.
const BACKOFF_BASE: std::time::Duration = std::time::Duration::from_secs(5);
const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_mins(5);
const CONFLICT_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// Requeue after a failed reconcile: conflicts at once, everything else with exponential backoff.
pub fn error_policy(qc: Arc<QueueConsumer>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.error(err.reason());
    if err.is_conflict() {
        return Action::requeue(CONFLICT_RETRY);
    }
    let mut failures = ctx.failures();
    let n = failures.entry(ConsumerKey::of(&qc)).or_default();
    *n = n.saturating_add(1);
    let delay = BACKOFF_BASE
        .saturating_mul(1u32 << (*n - 1).min(10))
        .min(BACKOFF_MAX);
    tracing::warn!(queueconsumer = %name_of(&qc), error = %err, retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// One reconcile of one QueueConsumer.
pub async fn reconcile(qc: Arc<QueueConsumer>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
    let result = Box::pin(reconcile_inner(&qc, &ctx)).await;
    if result.is_ok() {
        ctx.failures().remove(&ConsumerKey::of(&qc));
    }
    result
}

async fn reconcile_inner(qc: &QueueConsumer, ctx: &Context) -> Result<Action, Error> {
    let ns = qc.namespace().ok_or(Error::MissingNamespace)?;
    let name = qc.name_any();
    let qcs: Api<QueueConsumer> = Api::namespaced(ctx.client.clone(), &ns);
    let (region, endpoint) = observe::aws_target(&qc.spec);
    // A tenant's endpoint the operator does not allow gets no request, signed or not: no client for it
    // is even built.
    let clients = match endpoint.as_deref().map(|e| ctx.endpoints.check(e)) {
        Some(Err(refused)) => Err(refused),
        _ => Ok(ctx
            .aws
            .clients(region.as_deref(), endpoint.as_deref())
            .await),
    };

    if qc.metadata.deletion_timestamp.is_some() {
        ctx.scaling.forget(&ConsumerKey::of(qc));
        ctx.redrives.forget(&ConsumerKey::of(qc));
        ctx.workers.forget(&ConsumerKey::of(qc));
        ctx.metrics.consumers.remove(&ns, &qc.name_any());
        return cleanup(qc, ctx, &qcs, clients.as_ref().ok()).await;
    }

    // observe
    let observed = match &clients {
        Ok(clients) => {
            ctx.facts
                .get(
                    &qc.spec.queue.url,
                    endpoint.as_deref(),
                    qc.spec.scaling.poll_interval,
                    clients,
                )
                .await
        }
        Err(refused) => Err(ObserveError::EndpointNotAllowed(refused.clone())),
    };
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let live = deployments
        .get_opt(&name)
        .await
        .map_err(Error::ReadDeployment)?;

    // the worker pods: crash loops, and their /metrics once per poll interval; then the sample, with
    // the deletes their counters show
    let (pods, mut workers) = read_workers(qc, ctx, &ns, false).await;
    if let Ok(o) = &observed {
        record_sample(qc, ctx, o);
    }

    // validate, build, decide replicas; the rules run again with an observed P99 above the declared one
    let facts = pipeline::Observation::from_result(observed.as_ref().map(|o| &o.facts));
    let mut decision = pipeline::decide(qc, facts, live.as_ref(), &ctx.render);
    if let Some(p99) = status::observed_p99_above_declared(&qc.spec, &workers) {
        decision.report = pipeline::with_observed_p99(qc, facts, &decision.report, p99);
    }

    // apply; a Deployment someone else controls is neither changed nor reported as ours
    let mut deployment = live.filter(|d| pipeline::controls(qc, d));
    let mut applied = None;
    if let Rollout::Apply(rendered) = &decision.rollout {
        let desired = apply::with_fingerprint((**rendered).clone());
        if apply::needs_apply(&desired, deployment.as_ref()) {
            let verb = if deployment.is_some() {
                Applied::Updated
            } else {
                Applied::Created
            };
            let written = deployments
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&desired),
                )
                .await
                .map_err(Error::ApplyDeployment)?;
            ctx.metrics
                .deployment_applies
                .fetch_add(1, Ordering::Relaxed);
            deployment = Some(written);
            applied = Some(verb);
        }
    }

    // scale: the policy on the Deployment as it is now; replicas go out as their own manager's apply
    if deployment.is_some() {
        measure_startup(qc, ctx, pods.as_deref());
    }
    let now = observe::wall_clock();
    let replicas = ctx.scaling.with_history(&ConsumerKey::of(qc), now, |h| {
        pipeline::decide_replicas(
            qc,
            &decision.rollout,
            deployment.as_ref(),
            applied == Some(Applied::Created),
            h,
            now,
        )
    });
    let mut scaled = None;
    if let Some(n) = replicas.write() {
        let why = match &replicas {
            ReplicaDecision::Scale { current, decision } => {
                format!("from {current} to {n}: {decision}")
            }
            ReplicaDecision::Suspended { current } => format!(
                "from {current} to {n}: spec.suspend is true (pods drain what they hold, then exit)"
            ),
            ReplicaDecision::Keep => format!("to {n}"),
        };
        if let ReplicaDecision::Scale { current, .. } = &replicas
            && n < *current
        {
            // Idle pods go first: their deletion cost is their in-flight count, read just now.
            let (fresh_pods, fresh) = read_workers(qc, ctx, &ns, true).await;
            workers = fresh;
            set_deletion_costs(qc, ctx, &ns, fresh_pods.as_deref().or(pods.as_deref())).await;
        }
        let written = deployments
            .patch(
                &name,
                &PatchParams::apply(SCALER_FIELD_MANAGER).force(),
                &Patch::Apply(&apply::replicas_patch(&name, n)),
            )
            .await
            .map_err(Error::ScaleDeployment)?;
        ctx.metrics.scale_writes.fetch_add(1, Ordering::Relaxed);
        deployment = Some(written);
        scaled = Some(format!("scaled Deployment {name} {why}"));
    }

    // The alarm is a step of its own: a CloudWatch failure is reported in its condition and an Event,
    // and never fails the reconcile, so scaling keeps its poll interval.
    let alarm::AlarmOutcome {
        status: alarm_status,
        change: alarm_change,
    } = match &clients {
        Ok(clients) => alarm::sync(qc, &decision.alarm, clients.alarms.as_ref(), &qcs).await,
        Err(_) => alarm::AlarmOutcome::not_checked(qc),
    };

    // redrive: never fails the reconcile (its errors are in its status and Events); a refused
    // endpoint gets no client here either
    let redrive_client = match &clients {
        Ok(_) => {
            ctx.aws
                .redrive_client(region.as_deref(), endpoint.as_deref())
                .await
        }
        Err(_) => None,
    };
    let redrive = redrive::step(
        qc,
        &redrive::StepInputs {
            key: &ConsumerKey::of(qc),
            redrives: &ctx.redrives,
            client: redrive_client.as_ref(),
            endpoint: endpoint.as_deref(),
            facts: observed.as_ref().ok().map(|o| &o.facts),
            now: observe::now(),
        },
    )
    .await;

    // status
    let new_status = status::build(&StatusInputs {
        qc,
        facts,
        report: &decision.report,
        rollout: &decision.rollout,
        deployment: deployment.as_ref(),
        alarm: alarm_status.clone(),
        replicas: &replicas,
        scaled_at: scaled.as_ref().map(|_| observe::now()),
        sampled_at: observed.as_ref().ok().map(|o| o.sampled_at.clone()),
        redrive: redrive.status.clone(),
        workers: Some(&workers),
        now: observe::now(),
    });
    let mut old_status = qc.status.clone().unwrap_or_default();
    let foreign = status::foreign_condition_types(&qc.metadata, FIELD_MANAGER);
    old_status
        .conditions
        .retain(|c| !foreign.contains(&c.type_));
    if !status::same_ignoring_time(&old_status, &new_status) {
        let patch = json!({
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "status": new_status,
        });
        match qcs
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {
                ctx.metrics.status_writes.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                let e = Error::WriteStatus(e);
                // A conflict retries at once with fresh state, through the error policy.
                if e.is_conflict() {
                    return Err(e);
                }
                // Status is a report: failing to write it must not slow the next poll (or scaling).
                step_failed(ctx, qc, &e).await;
                return Ok(Action::requeue(qc.spec.scaling.poll_interval.as_std()));
            }
        }
    }

    ctx.metrics.consumers.set(
        &ns,
        &name,
        series::Series::from_status(
            qc.metadata.uid.as_deref().unwrap_or(""),
            &qc.spec,
            &new_status,
        ),
    );

    // events, on transitions only
    for t in status::transitions(&old_status.conditions, &new_status.conditions) {
        let note = format!("{} is {}: {}", t.type_, t.status, t.message);
        ctx.distinct_event(qc, t.warning, "Reconcile", &t.reason, note)
            .await;
    }
    if let Some(note) = scaled {
        ctx.distinct_event(qc, false, "Scale", SCALED, note).await;
    }
    for e in redrive.events {
        ctx.distinct_event(qc, e.warning, "Redrive", e.reason, e.note)
            .await;
    }
    if let Some(applied) = applied {
        let verb = applied.verb();
        ctx.event(
            qc,
            false,
            &format!("Deployment{verb}"),
            format!("{verb} Deployment {name}"),
        )
        .await;
    }
    match &alarm_change {
        AlarmChange::None => {}
        AlarmChange::Created(a) | AlarmChange::Updated(a) => {
            ctx.event(
                qc,
                false,
                "AlarmSynced",
                format!("CloudWatch alarm {a} is in sync"),
            )
            .await;
        }
        AlarmChange::Deleted(a) => {
            ctx.event(
                qc,
                false,
                "AlarmDeleted",
                format!("deleted CloudWatch alarm {a}"),
            )
            .await;
        }
    }

    if let status::AlarmSync::Failed { reason, message } = &alarm_status.sync {
        ctx.metrics.error(reason);
        ctx.event(qc, true, reason, message.clone()).await;
    }
    match observed {
        // Only a change of the spec (or of the operator's allow-list, which restarts it) can help.
        Err(ObserveError::EndpointNotAllowed(_)) => return Ok(Action::await_change()),
        Err(e) => return Err(Error::ObserveQueue(e)),
        Ok(_) => {}
    }
    Ok(match decision.rollout {
        // Only a spec change can fix a spec that cannot be rendered.
        Rollout::HeldInvalidSpec(_) => Action::await_change(),
        // Queue depth cannot be watched: look again after the poll interval, on this
        // QueueConsumer's own slot of it.
        _ => Action::requeue(spread::next_poll(
            &ConsumerKey::of(qc),
            qc.spec.scaling.poll_interval.as_std(),
            observe::wall_clock().as_millis(),
        )),
    })
}

/// The worker pods (None when they could not be listed) and what their /metrics say. Scrapes when one
/// is due (once per pollInterval) or `now`. Never fails the reconcile: a pod list or scrape that fails
/// leaves the observation without those pods (logged), and scaling goes on.
async fn read_workers(
    qc: &QueueConsumer,
    ctx: &Context,
    ns: &str,
    now: bool,
) -> (Option<Vec<Pod>>, Workers) {
    let id = ConsumerKey::of(qc);
    let name = qc.name_any();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let params = ListParams::default().labels(&crate::render::selector_string(&name));
    let pods = match api.list(&params).await {
        Ok(list) => Some(list.items),
        Err(e) => {
            tracing::warn!(queueconsumer = %name_of(qc), error = %e, "cannot list the worker pods");
            None
        }
    };
    if let Some(pods) = &pods
        && (now || ctx.workers.due(&id, qc.spec.scaling.poll_interval))
    {
        let targets: Vec<_> = pods.iter().filter_map(workers::target).collect();
        let (round, errors) = workers::scrape(&targets, observe::wall_clock()).await;
        for e in &errors {
            tracing::warn!(queueconsumer = %name_of(qc), error = %e, "cannot read a worker pod's metrics");
        }
        ctx.workers.push(&id, round);
    }
    let window = ctx.workers.get(&id);
    let latest = window.as_ref().and_then(|w| w.latest());
    let observed = Workers {
        stats: window.as_ref().and_then(workers::Window::stats),
        pods: latest.map_or(0, |r| r.pods.len()),
        unreachable: latest.map_or(0, |r| r.unreachable.len()),
        in_flight: latest.map_or(0, |r| r.pods.values().map(|m| m.in_flight).sum()),
        sampled_at: latest.map(|r| timestamp_time(r.at)),
        crash_looping: pods
            .as_deref()
            .map(workers::crash_looping)
            .unwrap_or_default(),
    };
    // Small moves of a busy consumer's numbers are not news: no status write for them.
    (pods, status::dead_band(qc, observed))
}

fn timestamp_time(
    t: crate::scaling::Timestamp,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    let secs = i64::try_from(t.as_millis() / 1000).unwrap_or(0);
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::from_second(secs)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

/// Before a scale-down: `controller.kubernetes.io/pod-deletion-cost` on each worker pod from its
/// in-flight count, as field manager `qc-operator-scaler`, so the ReplicaSet removes idle pods first.
/// A merge patch, not an apply: it can never create a pod that went away meanwhile. A failed patch is
/// logged and the scale-down goes on (the ReplicaSet then picks as it would without the hint).
async fn set_deletion_costs(qc: &QueueConsumer, ctx: &Context, ns: &str, pods: Option<&[Pod]>) {
    let Some(pods) = pods else { return };
    let window = ctx.workers.get(&ConsumerKey::of(qc));
    let busy = i64::from(qc.spec.processing.concurrency);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let params = PatchParams {
        field_manager: Some(SCALER_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    for (pod, cost) in workers::deletion_costs(pods, window.as_ref().and_then(|w| w.latest()), busy)
    {
        let patch =
            json!({"metadata": {"annotations": {workers::DELETION_COST: cost.to_string()}}});
        match api.patch(&pod, &params, &Patch::Merge(&patch)).await {
            Ok(_) => {
                ctx.metrics
                    .deletion_cost_writes
                    .fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                tracing::warn!(queueconsumer = %name_of(qc), pod, error = %e, "cannot set the pod deletion cost");
            }
        }
    }
}

/// The queue's counts into this QueueConsumer's history, when a sample is due.
fn record_sample(qc: &QueueConsumer, ctx: &Context, o: &observe::Observed) {
    let key = ConsumerKey::of(qc);
    match ctx.scaling.record_with_age(
        &key,
        &qc.spec,
        &o.facts.queue,
        o.facts.oldest_age_seconds,
        ctx.workers.deleted(&key),
        o.at,
        observe::wall_clock(),
    ) {
        Ok(scale::Recorded::Restarted) => {
            tracing::info!(queueconsumer = %key, "no sample for longer than the stabilization window: scaling history restarted");
        }
        Ok(_) => {}
        // SQS left a count out: nothing is pushed, and the policy holds replicas on what it last saw.
        Err(e) => tracing::warn!(queueconsumer = %key, error = %e, "queue not sampled for scaling"),
    }
}

/// `scaleDownStabilization: auto` holds for the pods' start-up: now and then ([`scale::STARTUP_REFRESH`])
/// keep the median creation → Ready of the recent worker pods, from this reconcile's pod list. A failed
/// list (e.g. an install whose role cannot list pods) keeps what was known, 30s until then: the hold
/// never blocks a reconcile.
fn measure_startup(qc: &QueueConsumer, ctx: &Context, pods: Option<&[Pod]>) {
    let key = ConsumerKey::of(qc);
    let now = observe::wall_clock();
    if !qc.spec.scaling.scale_down_stabilization.is_auto() || !ctx.scaling.startup_due(&key, now) {
        return;
    }
    let measured = if let Some(pods) = pods {
        let pairs: Vec<_> = pods.iter().filter_map(scale::pod_startup).collect();
        crate::scaling::measured_startup(&pairs)
    } else {
        tracing::warn!(queueconsumer = %key, "pods not listed: the scale-down hold keeps its last start-up (30s until one is measured)");
        None
    };
    ctx.scaling.set_startup(&key, &qc.spec, measured, now);
}

/// A step failed that does not stop the others: a Warning Event and the error counter, no backoff.
async fn step_failed(ctx: &Context, qc: &QueueConsumer, e: &Error) {
    ctx.metrics.error(e.reason());
    tracing::warn!(queueconsumer = %name_of(qc), error = %e, "reconcile step failed");
    ctx.event(qc, true, e.reason(), e.to_string()).await;
}

/// Deletion: remove the alarm, then the finalizer. The Deployment goes by garbage collection. The
/// alarm's name comes from the object's identity (never from status, which anyone with status write
/// access can edit), and the alarm is deleted only when its tags say it is this object's.
async fn cleanup(
    qc: &QueueConsumer,
    ctx: &Context,
    qcs: &Api<QueueConsumer>,
    clients: Option<&observe::AwsClients>,
) -> Result<Action, Error> {
    if !alarm::has_finalizer(qc) {
        return Ok(Action::await_change());
    }
    let name = alarm_name(qc);
    let Some(clients) = clients else {
        ctx.event(
            qc,
            true,
            "EndpointNotAllowed",
            format!("CloudWatch alarm {name} was not deleted: spec.queue.endpoint is not allowed by this operator, so no request is sent to it"),
        )
        .await;
        alarm::remove_finalizer(qc, qcs).await?;
        return Ok(Action::await_change());
    };
    match clients.alarms.delete(&name, &alarm::owner(qc)).await {
        Ok(AlarmDeletion::Deleted | AlarmDeletion::Absent) => {}
        Ok(AlarmDeletion::NotOurs { why }) => {
            ctx.event(
                qc,
                true,
                "AlarmNotOwned",
                format!("CloudWatch alarm {name} was left in place: {why}"),
            )
            .await;
        }
        Err(e) => {
            ctx.event(
                qc,
                true,
                e.reason(),
                format!("cannot delete CloudWatch alarm {name}: {e}; the QueueConsumer is kept until it is deleted (or remove the finalizer {} by hand)", alarm::FINALIZER),
            )
            .await;
            return Err(Error::DeleteAlarm(e));
        }
    }
    alarm::remove_finalizer(qc, qcs).await?;
    Ok(Action::await_change())
}
