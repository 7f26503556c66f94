//! The reconciler: observe → validate → build → apply → scale → status for each QueueConsumer, plus the
//! DLQ alarm's finalizer. Orchestration only; decisions live in pure modules (validate, render, pipeline,
//! scaling, status). Each step is a function below; the error backoff, Events, the worker pods and the
//! deletion path have modules of their own.

pub mod access;
pub mod alarm;
pub mod apply;
pub mod backoff;
pub mod cache;
mod cleanup;
pub mod client;
pub mod error;
pub mod events;
pub mod finalizer;
pub mod key;
pub mod manage;
pub mod metrics;
pub mod observe;
pub mod pipeline;
pub mod plan;
mod pods;
pub mod redrive;
pub mod run;
pub mod scale;
pub mod series;
pub mod slots;
pub mod spread;
pub mod status;
pub mod target;
pub mod triage;
pub mod triggers;
pub mod workers;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{ObjectRef, Store};
use serde_json::json;

use crate::api::{API_VERSION, KIND, Mode, QueueConsumer, QueueConsumerStatus};
use crate::aws::ObserveError;
use crate::aws::endpoints::AllowedEndpoints;
use crate::render::RenderOptions;
use crate::tenancy::{TenancyError, TenancyPolicy, Tenant};
use crate::validate::limits::{AdminLimits, Limited};

use self::alarm::AlarmChange;
use self::apply::{Applied, FIELD_MANAGER, SCALER_FIELD_MANAGER};
pub use self::backoff::error_policy;
pub use self::error::Error;
pub use self::events::SCALED;
pub use self::key::ConsumerKey;
pub use self::metrics::Metrics;
use self::observe::{AwsClients, AwsProvider, FactsCache};
use self::pipeline::{ReplicaDecision, Rollout};
use self::scale::Histories;
use self::status::{AlarmStatus, StatusInputs, Workers};

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
    /// Which namespaces may name which queues, accounts and roles (everything, unless the operator
    /// sets rules).
    pub tenancy: TenancyPolicy,
    /// Repeats of an Event folded into its series (`events::Folding`).
    pub folding: events::Folding,
    reporter: Reporter,
    pub metrics: Metrics,
    backoff: backoff::Backoff,
    /// The watch caches of QueueConsumers, to drop the series of deleted ones.
    stores: Mutex<Vec<Store<QueueConsumer>>>,
    /// When this process last wrote each QueueConsumer's status (and so its counts).
    status_written: Mutex<HashMap<ConsumerKey, crate::scaling::Timestamp>>,
    /// The status this process last wrote for each QueueConsumer, with the resourceVersion the write
    /// left, until the watch cache shows that write (`status_as_written`).
    status_sent: Mutex<HashMap<ConsumerKey, SentStatus>>,
    /// How long the counts in a status stand when nothing else changed ([`status::COUNTS_REFRESH`];
    /// tests shorten it).
    pub counts_refresh: std::time::Duration,
    /// The administrator's floors and caps (`validate::limits`; none unless the operator sets them).
    pub limits: AdminLimits,
    /// One deadline per reconcile ([`DEFAULT_RECONCILE_TIMEOUT`]; `run --reconcile-timeout`).
    pub reconcile_timeout: std::time::Duration,
    /// The reconciles that run at once, shared fairly between namespaces (`run` sizes it).
    pub reconcile_slots: Arc<slots::Slots>,
    /// Namespaced mode: the operator's RoleBinding in each watched namespace, held while QueueConsumers
    /// there hold finalizers (`run --access-binding`; none otherwise).
    pub access: Option<access::AccessBinding>,
    /// Tracing on (`telemetry::otlp`): a `qc.reconcile` span per reconcile, a child per step. None:
    /// no span is made.
    pub tracer: Option<opentelemetry_sdk::trace::SdkTracer>,
}

/// A reconcile normally takes well under a second; each AWS call is bounded by the SDK's operation
/// timeout (12 s), but a reconcile makes several, and waits its namespace's turn for the shared AWS
/// budget. Past this it is cancelled (as a restart would cut it) and tried again with backoff.
pub const DEFAULT_RECONCILE_TIMEOUT: std::time::Duration = std::time::Duration::from_mins(2);

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
        Context {
            client,
            aws,
            facts: FactsCache::new(),
            scaling: Histories::new(),
            redrives: redrive::Redrives::new(),
            workers: workers::Windows::new(),
            render,
            endpoints: AllowedEndpoints::aws_only(),
            tenancy: TenancyPolicy::allow_all(),
            folding: events::Folding::default(),
            reporter,
            metrics: Metrics::default(),
            backoff: backoff::Backoff::default(),
            stores: Mutex::new(Vec::new()),
            status_written: Mutex::new(HashMap::new()),
            status_sent: Mutex::new(HashMap::new()),
            counts_refresh: status::COUNTS_REFRESH,
            limits: AdminLimits::default(),
            reconcile_timeout: DEFAULT_RECONCILE_TIMEOUT,
            reconcile_slots: slots::Slots::new(usize::from(run::DEFAULT_RECONCILE_CONCURRENCY)),
            access: None,
            tracer: None,
        }
    }

    /// Runs one reconcile step as a child span of the reconcile's (`qc.{name}`); just `step` when
    /// tracing is off or the reconcile is not sampled.
    async fn step<T>(&self, name: &'static str, step: impl std::future::Future<Output = T>) -> T {
        use opentelemetry::trace::{FutureExt as _, TraceContextExt as _, Tracer as _};
        let cx = opentelemetry::Context::current();
        let Some(tracer) = &self.tracer else {
            return step.await;
        };
        if !cx.span().is_recording() {
            return step.await;
        }
        let span = tracer.start_with_context(format!("qc.{name}"), &cx);
        let cx = cx.with_span(span);
        let out = step.with_context(cx.clone()).await;
        cx.span().end();
        out
    }

    /// Remember a controller's QueueConsumer cache: series of consumers no cache holds are dropped.
    pub fn watch_store(&self, store: Store<QueueConsumer>) {
        crate::sync::lock(&self.stores).push(store);
    }

    /// QueueConsumers of `qc`'s namespace created before it (then by name), from the watch caches;
    /// None without a cache (reconcile called directly) or without a per-namespace cap.
    fn older_in_namespace(&self, qc: &QueueConsumer) -> Option<usize> {
        self.limits.max_consumers_per_namespace?;
        let stores = crate::sync::lock(&self.stores).clone();
        if stores.is_empty() {
            return None;
        }
        let ns = qc.metadata.namespace.as_deref();
        let rank = |q: &QueueConsumer| {
            (
                q.metadata.creation_timestamp.as_ref().map(|t| t.0),
                q.metadata.name.clone().unwrap_or_default(),
            )
        };
        let me = rank(qc);
        let mut seen = HashSet::new();
        Some(
            stores
                .iter()
                .flat_map(Store::state)
                .filter(|q| q.metadata.namespace.as_deref() == ns)
                .filter(|q| q.metadata.deletion_timestamp.is_none())
                .filter(|q| rank(q) < me)
                .filter(|q| seen.insert(q.metadata.name.clone()))
                .count(),
        )
    }

    /// Drop the series of QueueConsumers that were deleted (a consumer without finalizer is not
    /// reconciled again after its deletion). Without a cache (reconcile called directly), nothing is.
    pub fn forget_deleted_consumers(&self) {
        let stores = crate::sync::lock(&self.stores).clone();
        if stores.is_empty() {
            return;
        }
        self.metrics.consumers.retain(|ns, name, uid| {
            stores.iter().any(|s| {
                s.get(&ObjectRef::new(name).within(ns))
                    .is_some_and(|q| q.metadata.uid.as_deref().unwrap_or("") == uid)
            })
        });
        let live: HashSet<ConsumerKey> = stores
            .iter()
            .flat_map(Store::state)
            .map(|q| ConsumerKey::of(&q))
            .collect();
        crate::sync::lock(&self.status_written).retain(|k, _| live.contains(k));
        let mut sent = crate::sync::lock(&self.status_sent);
        sent.retain(|k, _| live.contains(k));
        shrink_sparse(&mut sent);
    }

    /// The watch cache now holds `qc`: a status this process wrote that `qc` shows (its resourceVersion
    /// at or past the write's) is no longer needed. Without this an entry stayed until the consumer's
    /// next reconcile, a poll interval later, so the map held a whole status for every QueueConsumer.
    pub fn status_seen(&self, qc: &QueueConsumer) {
        let Some(cached) = revision(qc) else {
            return;
        };
        let key = ConsumerKey::of(qc);
        let mut sent = crate::sync::lock(&self.status_sent);
        if sent
            .get(&key)
            .is_some_and(|entry| cached >= entry.resource_version)
        {
            sent.remove(&key);
            shrink_sparse(&mut sent);
        }
    }

    /// Statuses written and not yet seen in the watch cache (tests).
    pub fn statuses_awaiting_the_watch(&self) -> usize {
        crate::sync::lock(&self.status_sent).len()
    }

    /// The newest copy of `qc` in the watch caches (the same object: the same uid), if any.
    fn newest(&self, qc: &QueueConsumer) -> Option<Arc<QueueConsumer>> {
        let r = ObjectRef::new(&qc.name_any()).within(&qc.namespace()?);
        let stores = crate::sync::lock(&self.stores);
        stores
            .iter()
            .find_map(|s| s.get(&r))
            .filter(|c| c.metadata.uid == qc.metadata.uid)
    }

    /// The status as last written, to compare a new one with: this process's last write when the watch
    /// cache does not show it yet, else the cache's newest status. The newest, not `qc`'s: `qc` is the
    /// copy the reconcile was handed when it fell due, and it may have waited for a slot while the watch
    /// moved on; compared with that older status, a status this process already wrote would be written
    /// again (a request the server answers with nothing changed, and the same transition Events twice).
    /// resourceVersions are compared as the integers kube-apiserver makes them (etcd revisions); one
    /// that is not an integer is taken as caught up.
    fn status_as_written(&self, qc: &QueueConsumer) -> QueueConsumerStatus {
        let key = ConsumerKey::of(qc);
        // The awaited write first, then the cache: the watch lets go of a write only once the cache
        // holds it (`status_seen`), so whichever way the two race, one of them has it.
        let sent = crate::sync::lock(&self.status_sent)
            .get(&key)
            .map(|e| (e.resource_version, (*e.status).clone()));
        let newest = self.newest(qc);
        let current = newest.as_deref().unwrap_or(qc);
        let cached = revision(current);
        match sent {
            Some((written, status)) if cached.is_some_and(|c| c < written) => status,
            _ => current.status.clone().unwrap_or_default(),
        }
    }

    /// Keeps the status this reconcile wrote (`rv` the resourceVersion the write left) until the watch
    /// cache shows it. The watch may have brought the write before this runs: then it is let go of here.
    fn keep_written_status(&self, qc: &QueueConsumer, rv: u64, status: &QueueConsumerStatus) {
        let key = ConsumerKey::of(qc);
        crate::sync::lock(&self.status_sent).insert(
            key,
            SentStatus {
                resource_version: rv,
                status: Box::new(status.clone()),
            },
        );
        if let Some(newest) = self.newest(qc) {
            self.status_seen(&newest);
        }
    }
}

/// `qc`'s resourceVersion as the integer kube-apiserver makes it (an etcd revision), for ordering; None
/// when it is not one.
fn revision(qc: &QueueConsumer) -> Option<u64> {
    qc.metadata.resource_version.as_deref()?.parse().ok()
}

/// A status write of this process and the resourceVersion it left. Boxed: the map holds an entry for
/// every QueueConsumer whose write the watch has not shown yet, which after a catch-up was all of
/// them, and a status held inline made each of the table's slots over a kilobyte (20 MB at 10,000).
struct SentStatus {
    resource_version: u64,
    status: Box<QueueConsumerStatus>,
}

/// Gives back the memory of a map that has emptied out: a hash table never shrinks by itself, so one
/// sized by a catch-up's burst would stay that size.
pub(crate) fn shrink_sparse<K: Eq + std::hash::Hash, V>(map: &mut HashMap<K, V>) {
    if map.capacity() > 64 && map.len() * 4 < map.capacity() {
        map.shrink_to(map.len() * 2);
    }
}

/// namespace/name, for log lines.
fn name_of(qc: &QueueConsumer) -> String {
    format!("{}/{}", qc.namespace().unwrap_or_default(), qc.name_any())
}

/// One reconcile of one QueueConsumer.
pub async fn reconcile(qc: Arc<QueueConsumer>, ctx: Arc<Context>) -> Result<Action, Error> {
    // A slot in its namespace's turn (`slots`), then one deadline for the whole reconcile, and its AWS
    // calls queued in its namespace's turn too (`aws::limit`).
    let namespace = qc.namespace().unwrap_or_default();
    let _slot = ctx.reconcile_slots.acquire(&namespace).await;
    ctx.metrics.reconciles.fetch_add(1, Ordering::Relaxed);
    let began = std::time::Instant::now();
    let span = ctx.tracer.as_ref().map(|t| {
        use opentelemetry::trace::{SpanKind, Tracer as _};
        let span = t
            .span_builder("qc.reconcile")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                opentelemetry::KeyValue::new("k8s.namespace.name", namespace.clone()),
                opentelemetry::KeyValue::new("qc.queueconsumer", qc.name_any()),
                opentelemetry::KeyValue::new(
                    "qc.generation",
                    qc.metadata.generation.unwrap_or_default(),
                ),
            ])
            .start(t);
        opentelemetry::trace::TraceContextExt::with_span(&opentelemetry::Context::new(), span)
    });
    let run = crate::aws::limit::in_namespace(namespace, Box::pin(reconcile_inner(&qc, &ctx)));
    let timed = tokio::time::timeout(ctx.reconcile_timeout, run);
    let result = match &span {
        Some(cx) => opentelemetry::trace::FutureExt::with_context(timed, cx.clone()).await,
        None => timed.await,
    }
    .unwrap_or(Err(Error::DeadlineExceeded(ctx.reconcile_timeout)));
    if let Some(cx) = span {
        use opentelemetry::trace::TraceContextExt as _;
        let s = cx.span();
        if let Err(e) = &result {
            s.set_status(opentelemetry::trace::Status::error(e.to_string()));
            s.set_attribute(opentelemetry::KeyValue::new("qc.error", e.reason()));
        }
        s.end();
    }
    ctx.metrics
        .reconcile_duration
        .0
        .observe(began.elapsed().as_secs_f64());
    if result.is_ok() {
        ctx.backoff.succeeded(&ConsumerKey::of(&qc));
    }
    result
}

async fn reconcile_inner(qc: &QueueConsumer, ctx: &Context) -> Result<Action, Error> {
    // The next slot is counted from here: a reconcile that outlasts the time to its slot (a loaded
    // machine, slow AWS calls) must not skip it, or the QueueConsumer would go longer than an interval.
    let started_ms = observe::wall_clock().as_millis();
    let ns = qc.namespace().ok_or(Error::MissingNamespace)?;
    let name = qc.name_any();
    let qcs: Api<QueueConsumer> = Api::namespaced(ctx.client.clone(), &ns);
    // The administrator's floors and caps: the rest of the reconcile runs the spec within them, and
    // each change is a finding; a consumer past the namespace's cap gets no AWS call at all. One being
    // deleted is never past it: its cleanup (the DLQ alarm) must be able to run.
    let older = if qc.metadata.deletion_timestamp.is_some() {
        None
    } else {
        ctx.older_in_namespace(qc)
    };
    let (limited, limit_findings, past_cap) = match ctx.limits.apply(&qc.spec, older) {
        Limited::Run { findings, .. } if findings.is_empty() => (None, findings, None),
        Limited::Run { spec, findings } => (
            Some(QueueConsumer {
                spec: *spec,
                ..qc.clone()
            }),
            findings,
            None,
        ),
        Limited::Refused(finding) => (None, vec![finding], older),
    };
    let qc = limited.as_ref().unwrap_or(qc);
    let target = observe::aws_target(qc);
    let endpoint = target.endpoint.clone();
    let clients = match past_cap {
        Some(older) => Err(ObserveError::NotAllowedByPolicy(
            TenancyError::NamespaceConsumerCapReached {
                namespace: ns.clone(),
                older,
                cap: ctx.limits.max_consumers_per_namespace.unwrap_or(0),
            },
        )),
        None => {
            ctx.step("aws_clients", aws_clients(ctx, qc, &ns, &target))
                .await
        }
    };

    if qc.metadata.deletion_timestamp.is_some() {
        ctx.scaling.forget(&ConsumerKey::of(qc));
        ctx.redrives.forget(&ConsumerKey::of(qc));
        ctx.workers.forget(&ConsumerKey::of(qc));
        crate::sync::lock(&ctx.status_written).remove(&ConsumerKey::of(qc));
        crate::sync::lock(&ctx.status_sent).remove(&ConsumerKey::of(qc));
        ctx.metrics.consumers.remove(&ns, &qc.name_any());
        return cleanup::cleanup(qc, ctx, &qcs, clients.as_ref()).await;
    }

    // observe
    let mut observed = match &clients {
        Ok(clients) => {
            ctx.step(
                "observe",
                ctx.facts.get(
                    &qc.spec.queue.url,
                    &target,
                    (&ctx.tenancy, &ns),
                    qc.spec.scaling.poll_interval,
                    clients,
                    observe::SourceAge::of(&qc.spec),
                ),
            )
            .await
        }
        Err(refused) => Err(refused.clone()),
    };
    // manage: the queue's settings raised (or the queue created) before the rules see it, and read
    // again, so the findings it fixed are gone from this status already
    let managed = ctx
        .step("manage", manage_queue(ctx, qc, &target, &observed))
        .await;
    // A failure or refusal that QueueManaged already shows (same reason) made its Event when it began:
    // one Event per cause, not one per poll.
    let again = managed.condition.as_ref().is_some_and(|c| {
        qc.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|o| {
                o.type_ == crate::api::conditions::QUEUE_MANAGED
                    && o.status == "False"
                    && o.reason == c.reason
            })
        })
    });
    // at once: a change made is an Event even if a later step fails this reconcile
    for e in managed.events.iter().filter(|e| !(e.warning && again)) {
        ctx.distinct_event(qc, e.warning, "ManageQueue", e.reason, e.note.clone())
            .await;
    }
    if managed.reread
        && let Ok(clients) = &clients
    {
        let tenancy = (&ctx.tenancy, ns.as_str());
        ctx.facts.forget(&qc.spec.queue.url, &target, tenancy).await;
        observed = ctx
            .facts
            .get(
                &qc.spec.queue.url,
                &target,
                tenancy,
                qc.spec.scaling.poll_interval,
                clients,
                observe::SourceAge::of(&qc.spec),
            )
            .await;
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    // Scale-only mode reads the target's /scale, and neither a Deployment of ours nor worker pods.
    let mut scale_target = match qc.spec.mode() {
        Mode::ScaleOnly(t) => Some(target::read(&ctx.client, &ns, &name, t).await),
        Mode::Worker => None,
    };
    let live = deployments
        .get_opt(&name)
        .await
        .map_err(Error::ReadDeployment)?;
    let live = match scale_target {
        // Switched to scale-only mode: the bundled worker's Deployment this QueueConsumer controls would
        // go on consuming beside the user's consumer, so it goes (its pods drain what they hold).
        Some(_) => {
            if let Some(d) = live.filter(|d| pipeline::controls(qc, d)) {
                retire_worker_deployment(ctx, qc, &deployments, &d).await?;
            }
            None
        }
        None => live,
    };

    // the worker pods: crash loops, and their /metrics once per poll interval; then the sample, with
    // the deletes their counters show
    let (pods, mut workers) = match scale_target {
        Some(_) => (None, Workers::default()),
        None => {
            ctx.step("read_workers", pods::read_workers(qc, ctx, &ns, false))
                .await
        }
    };
    if let Ok(o) = &observed {
        record_sample(qc, ctx, o);
    }

    // validate, build, decide replicas; the rules run again with an observed P99 above the declared one
    let facts = pipeline::Observation::from_result(observed.as_ref().map(|o| &o.facts));
    let mut decision = pipeline::decide(qc, facts, live.as_ref(), &ctx.render);
    if let Some(p99) = status::observed_p99_above_declared(&qc.spec, &workers) {
        decision.report = pipeline::with_observed_p99(qc, facts, &decision.report, p99);
    }
    decision.report.findings.extend(limit_findings);

    // apply; a Deployment someone else controls is neither changed nor reported as ours
    let mut deployment = live.filter(|d| pipeline::controls(qc, d));
    let applied = match ctx
        .step(
            "apply",
            apply_deployment(ctx, &deployments, &name, &decision.rollout, &mut deployment),
        )
        .await?
    {
        DeploymentWrite::Done(applied) => applied,
        DeploymentWrite::TemplateRefused(message) => {
            decision
                .report
                .findings
                .push(crate::validate::template_invalid(&message));
            None
        }
    };

    // scale: the policy on the Deployment as it is now; replicas go out as their own manager's apply
    if deployment.is_some() {
        pods::measure_startup(qc, ctx, pods.as_deref());
    }
    let now = observe::wall_clock();
    let replicas = ctx.scaling.with_history(&ConsumerKey::of(qc), now, |h| {
        pipeline::decide_replicas(
            qc,
            &decision.rollout,
            match &scale_target {
                Some(t) => t.found().map(|t| t.asks),
                None => deployment.as_ref().map(pipeline::current_replicas),
            },
            applied == Some(Applied::Created),
            h,
            workers.downstream(),
            now,
        )
    });
    let scaled = match (qc.spec.mode(), scale_target.as_mut()) {
        (Mode::ScaleOnly(t), Some(read)) => scale_target_write(ctx, &ns, t, &replicas, read).await,
        _ => {
            ctx.step(
                "scale",
                scale_deployment(
                    qc,
                    ctx,
                    &ns,
                    &replicas,
                    &mut deployment,
                    pods.as_deref(),
                    &mut workers,
                ),
            )
            .await?
        }
    };

    // maxRate: the running pods' shares, for the replicas before and after this decision
    if deployment.is_some() {
        let (current, target) = match &replicas {
            ReplicaDecision::Scale { current, decision } => (*current, decision.replicas),
            ReplicaDecision::Suspended { current } => (*current, 0),
            ReplicaDecision::Keep => {
                let n = deployment
                    .as_ref()
                    .and_then(|d| d.spec.replicas)
                    .and_then(|r| u32::try_from(r).ok())
                    .unwrap_or(0);
                (n, n)
            }
        };
        pods::set_rate_shares(qc, ctx, &ns, pods.as_deref(), current, target).await;
    }

    // The alarm is a step of its own: a CloudWatch failure is reported in its condition and an Event,
    // and never fails the reconcile, so scaling keeps its poll interval.
    let alarm::AlarmOutcome {
        status: alarm_status,
        change: alarm_change,
    } = match &clients {
        Ok(clients) => {
            ctx.step(
                "alarm",
                alarm::sync(
                    qc,
                    &decision.alarm,
                    clients.alarms.as_ref(),
                    &qcs,
                    ctx.access.as_ref(),
                ),
            )
            .await
        }
        Err(_) => alarm::AlarmOutcome::not_checked(qc),
    };

    // redrive: never fails the reconcile (its errors are in its status and Events); a refused
    // endpoint gets no client here either
    let redrive_client = match &clients {
        // Tagged as the controller's calls (`app/qc-operator`), whoever built the client.
        Ok(_) => ctx
            .aws
            .redrive_client(&target)
            .await
            .map(crate::aws::operator_sqs),
        Err(_) => None,
    };
    let redrive = ctx
        .step(
            "redrive",
            redrive::step(
                qc,
                &redrive::StepInputs {
                    key: &ConsumerKey::of(qc),
                    redrives: &ctx.redrives,
                    client: redrive_client.as_ref(),
                    endpoint: endpoint.as_deref(),
                    facts: observed.as_ref().ok().map(|o| &o.facts),
                    now: observe::now(),
                    recovery_rate: qc
                        .spec
                        .dead_letter
                        .redrive_after_recovery
                        .as_ref()
                        .map_or_else(crate::api::defaults::recovery_rate, |r| r.rate),
                },
            ),
        )
        .await;

    // status
    let new_status = status::build(&StatusInputs {
        qc,
        facts,
        report: &decision.report,
        rollout: &decision.rollout,
        deployment: deployment.as_ref(),
        target: scale_target.as_ref(),
        applied,
        alarm: alarm_status.clone(),
        replicas: &replicas,
        scaled_at: scaled.as_ref().map(|_| observe::now()),
        sampled_at: observed.as_ref().ok().map(|o| o.sampled_at.clone()),
        redrive: redrive.status.clone(),
        redrive_after_recovery: redrive.after_recovery.clone(),
        workers: Some(&workers),
        now: observe::now(),
    });
    let mut new_status = new_status;
    // DLQ triage: after the redrive step, never while a move of this QueueConsumer runs.
    let moving = ctx.redrives.running(&ConsumerKey::of(qc))
        || redrive.status.as_ref().and_then(|r| r.state.as_deref()) == Some(redrive::RUNNING)
        || redrive
            .after_recovery
            .as_ref()
            .and_then(|r| r.state.as_deref())
            == Some(redrive::RUNNING);
    let decided = triage::decide(
        qc,
        observed.as_ref().ok().map(|o| &o.facts),
        moving,
        &observe::now(),
    );
    let old_dl = qc.status.as_ref().and_then(|s| s.dead_letter.as_ref());
    let (by_reason, by_reason_at) =
        match triage::step(decided, redrive_client.as_ref(), &observe::now()).await {
            Some(new) => new,
            None => (
                old_dl.map(|d| d.by_reason.clone()).unwrap_or_default(),
                old_dl.and_then(|d| d.by_reason_sampled_at.clone()),
            ),
        };
    if let Some(d) = new_status.dead_letter.as_mut() {
        d.by_reason = by_reason;
        d.by_reason_sampled_at = by_reason_at;
    }
    manage::apply_to_status(
        &managed,
        qc.spec.queue.manage,
        &qc.status.clone().unwrap_or_default(),
        &mut new_status,
        qc.metadata.generation,
        &observe::now(),
    );
    let mut old_status = ctx.status_as_written(qc);
    let foreign = status::foreign_condition_types(&qc.metadata, FIELD_MANAGER);
    old_status
        .conditions
        .retain(|c| !foreign.contains(&c.type_));
    // A busy queue's counts are written at most once a minute; anything else at once. Without a
    // write of this process's (a restart, a new leader), the counts are as old as their sampledAt.
    let key = ConsumerKey::of(qc);
    let written_at = crate::sync::lock(&ctx.status_written)
        .get(&key)
        .copied()
        .or_else(|| {
            old_status
                .queue
                .as_ref()
                .and_then(|q| q.sampled_at.as_ref())
                .map(crate::scaling::Timestamp::from_k8s)
        });
    let write_at = observe::wall_clock();
    let write = status::status_write(
        &old_status,
        &new_status,
        written_at,
        write_at,
        ctx.counts_refresh,
    );
    if let status::StatusWrite::Write(cause) = write {
        tracing::debug!(queueconsumer = %key, cause = cause.label(), "writing status");
        match ctx
            .step(
                "write_status",
                write_status(ctx, &qcs, &name, &new_status, cause),
            )
            .await
        {
            Ok(written) => {
                if let Some(rv) = revision(&written) {
                    ctx.keep_written_status(qc, rv, &new_status);
                }
            }
            // A conflict retries at once with fresh state, through the error policy.
            Err(e) if e.is_conflict() => return Err(e),
            Err(e) => {
                // Status is a report: failing to write it must not slow the next poll (or scaling).
                step_failed(ctx, qc, &e).await;
                return Ok(Action::requeue(qc.spec.scaling.poll_interval.as_std()));
            }
        }
        crate::sync::lock(&ctx.status_written).insert(key, write_at);
    }

    // The series carry what was just observed, written to status or held.
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
    alarm_events(qc, ctx, &alarm_change, &alarm_status).await;

    match observed {
        // Only a change of the spec (or of the operator's allow-list or tenancy policy, which
        // restarts it) can help.
        // Past the namespace's cap: another QueueConsumer's deletion frees a place, so look again.
        Err(ObserveError::NotAllowedByPolicy(TenancyError::NamespaceConsumerCapReached {
            ..
        })) => {
            return Ok(Action::requeue(qc.spec.scaling.poll_interval.as_std()));
        }
        Err(e) if e.is_refusal() => return Ok(Action::await_change()),
        Err(e) => return Err(Error::ObserveQueue(e)),
        Ok(_) => {}
    }
    // Only a spec change can fix a spec that cannot be rendered.
    if let Rollout::HeldInvalidSpec(_) = decision.rollout {
        return Ok(Action::await_change());
    }
    // Queue depth cannot be watched: look again after the poll interval, on this QueueConsumer's own
    // slot of it; after a first scrape of its pods, sooner, for the second (`workers::warm_up`).
    let poll = qc.spec.scaling.poll_interval;
    let slot = spread::after_reconcile(
        &ConsumerKey::of(qc),
        poll.as_std(),
        started_ms,
        observe::wall_clock().as_millis(),
    );
    let warm_up = ctx.workers.warm_up_in(&ConsumerKey::of(qc), poll);
    Ok(Action::requeue(warm_up.map_or(slot, |w| {
        slot.min(w.max(std::time::Duration::from_millis(100)))
    })))
}

/// `spec.queue.manage`'s step: the other QueueConsumers of the queue from the watch caches (or, without
/// them, a list), the writer for this QueueConsumer's target, then `manage::step`.
async fn manage_queue(
    ctx: &Context,
    qc: &QueueConsumer,
    target: &observe::AwsTarget,
    observed: &Result<observe::Observed, ObserveError>,
) -> manage::Outcome {
    if qc.spec.queue.manage.is_off() {
        return manage::Outcome::default();
    }
    let ns = qc.namespace().unwrap_or_default();
    if !qc.spec.suspend
        && let Err(e) = ctx.tenancy.check_manage(&ns, qc.spec.queue.manage)
    {
        return manage::Outcome::not_allowed(&e);
    }
    let stores = crate::sync::lock(&ctx.stores).clone();
    let all: Option<Vec<QueueConsumer>> = if stores.is_empty() {
        Api::<QueueConsumer>::all(ctx.client.clone())
            .list(&kube::api::ListParams::default())
            .await
            .map_err(
                |e| tracing::warn!(error = %e, "could not list QueueConsumers for queue.manage"),
            )
            .ok()
            .map(|l| l.items)
    } else {
        Some(
            stores
                .iter()
                .flat_map(Store::state)
                .map(|q| (*q).clone())
                .collect(),
        )
    };
    let peers = all.as_deref().map(|all| manage::peers(qc, all));
    // Only a QueueConsumer the tenancy policy and the endpoint allow-list admit was read at all.
    let writer = match observed {
        Ok(_) | Err(ObserveError::ReadQueueAttributes { .. }) => ctx.aws.queue_writer(target).await,
        Err(_) => None,
    };
    let allowed = |arn: &str| {
        ctx.tenancy
            .check_dead_letter(&ns, arn)
            .map_err(|e| e.to_string())
    };
    manage::step(
        qc,
        observed.as_ref().map(|o| &o.facts),
        writer.as_deref(),
        peers.as_deref(),
        &allowed,
    )
    .await
}

/// The SDK clients for this QueueConsumer's region, endpoint and role. A QueueConsumer the tenancy policy
/// refuses, or a tenant's endpoint the operator does not allow, gets no request, signed or not: no
/// client for it is even built.
async fn aws_clients(
    ctx: &Context,
    qc: &QueueConsumer,
    ns: &str,
    target: &observe::AwsTarget,
) -> Result<AwsClients, ObserveError> {
    ctx.tenancy
        .check(&Tenant::of(ns, &qc.spec, target.region.as_deref()))
        .map_err(ObserveError::NotAllowedByPolicy)?;
    if let Some(e) = &target.endpoint {
        ctx.endpoints
            .check(e)
            .map_err(ObserveError::EndpointNotAllowed)?;
    }
    Ok(ctx.aws.clients(target).await)
}

/// What applying the Deployment came to.
enum DeploymentWrite {
    /// Written (what was done, for an Event), or nothing to write.
    Done(Option<Applied>),
    /// The API server refused the Deployment for what the pod template says (strict field validation: an
    /// unknown field such as `serviceAcountName`, a bad quantity, a container without an image): its
    /// message, for ConfigValid=False/TemplateInvalid. The Deployment stays as it was.
    TemplateRefused(String),
}

/// Server-side apply of the rendered Deployment when it differs from `deployment` (the one this
/// QueueConsumer controls, if any), which becomes the Deployment as written. With strict field
/// validation: `spec.template` is an open object in the CRD, so a typo in it reaches the API server only
/// here, and without it the server drops the unknown field with a warning nobody reads.
async fn apply_deployment(
    ctx: &Context,
    deployments: &Api<Deployment>,
    name: &str,
    rollout: &Rollout,
    deployment: &mut Option<Deployment>,
) -> Result<DeploymentWrite, Error> {
    let Rollout::Apply(rendered) = rollout else {
        return Ok(DeploymentWrite::Done(None));
    };
    let desired = apply::with_fingerprint((**rendered).clone());
    if !apply::needs_apply(&desired, deployment.as_ref()) {
        return Ok(DeploymentWrite::Done(None));
    }
    let written = match deployments
        .patch(
            name,
            &PatchParams::apply(FIELD_MANAGER)
                .force()
                .validation_strict(),
            &Patch::Apply(&desired),
        )
        .await
    {
        Ok(written) => written,
        // 400: strict decoding (unknown or duplicate field, a value of the wrong type or form); 422:
        // the object's validation (a required field missing, a value out of range).
        Err(kube::Error::Api(s)) if s.code == 400 || s.code == 422 => {
            return Ok(DeploymentWrite::TemplateRefused(s.message));
        }
        // Server-side apply merges before it converts the object, so a malformed value (a quantity
        // such as `12XB`) fails there as a 500. A dry-run create decodes the object as sent and names
        // what is wrong (400 or 422); anything else leaves the apply's own error standing.
        Err(kube::Error::Api(s)) if s.code >= 500 => {
            let dry_run = PostParams {
                dry_run: true,
                field_manager: Some(FIELD_MANAGER.to_string()),
            };
            match deployments.create(&dry_run, &desired).await {
                Err(kube::Error::Api(d)) if d.code == 400 || d.code == 422 => {
                    return Ok(DeploymentWrite::TemplateRefused(d.message));
                }
                _ => return Err(Error::ApplyDeployment(kube::Error::Api(s))),
            }
        }
        Err(e) => return Err(Error::ApplyDeployment(e)),
    };
    ctx.metrics
        .deployment_applies
        .fetch_add(1, Ordering::Relaxed);
    let applied = Applied::of(deployment.as_ref(), &written);
    *deployment = Some(written);
    Ok(DeploymentWrite::Done(Some(applied)))
}

/// Why replicas go to `n`, for the Scaled Event; `suspended` says what becomes of the pods on suspend.
fn scale_note(replicas: &ReplicaDecision, n: u32, suspended: &str) -> String {
    match replicas {
        ReplicaDecision::Scale { current, decision } => {
            format!("from {current} to {n}: {decision}")
        }
        ReplicaDecision::Suspended { current } => {
            format!("from {current} to {n}: spec.suspend is true ({suspended})")
        }
        ReplicaDecision::Keep => format!("to {n}"),
    }
}

/// Writes `spec.replicas` when the decision changes it, as the scaler's own field manager; before a
/// scale-down, marks the idle pods to go first (with a fresh read of the workers, which replaces
/// `workers`). `deployment` becomes the Deployment as written. The note of the Scaled Event, if any.
async fn scale_deployment(
    qc: &QueueConsumer,
    ctx: &Context,
    ns: &str,
    replicas: &ReplicaDecision,
    deployment: &mut Option<Deployment>,
    pods: Option<&[Pod]>,
    workers: &mut Workers,
) -> Result<Option<String>, Error> {
    let Some(n) = replicas.write() else {
        return Ok(None);
    };
    let name = qc.name_any();
    let why = scale_note(replicas, n, "pods drain what they hold, then exit");
    if let ReplicaDecision::Scale { current, .. } = replicas
        && n < *current
    {
        // Idle pods go first: their deletion cost is their in-flight count, read just now.
        let (fresh_pods, fresh) = pods::read_workers(qc, ctx, ns, true).await;
        *workers = fresh;
        pods::set_deletion_costs(qc, ctx, ns, fresh_pods.as_deref().or(pods)).await;
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), ns);
    let written = deployments
        .patch(
            &name,
            &PatchParams::apply(SCALER_FIELD_MANAGER).force(),
            &Patch::Apply(&apply::replicas_patch(&name, n)),
        )
        .await
        .map_err(Error::ScaleDeployment)?;
    ctx.metrics.scale_writes.fetch_add(1, Ordering::Relaxed);
    *deployment = Some(written);
    Ok(Some(format!("scaled Deployment {name} {why}")))
}

/// Deletes the bundled worker's Deployment (scale-only mode replaced it), with an Event. Only the one
/// this QueueConsumer controls: the caller checked the owner reference, and the delete is conditional on
/// its uid, so a Deployment recreated meanwhile by someone else is left alone.
async fn retire_worker_deployment(
    ctx: &Context,
    qc: &QueueConsumer,
    deployments: &Api<Deployment>,
    d: &Deployment,
) -> Result<(), Error> {
    let name = d.name_any();
    let params = kube::api::DeleteParams {
        preconditions: d.metadata.uid.clone().map(|uid| kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..kube::api::DeleteParams::background()
    };
    match deployments.delete(&name, &params).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return Ok(()),
        Err(e) => return Err(Error::ApplyDeployment(e)),
    }
    ctx.event(
        qc,
        false,
        "DeploymentDeleted",
        format!(
            "deleted Deployment {name}, the bundled worker's: spec.scaleTargetRef (scale-only mode) replaces it; its pods drain what they hold"
        ),
    )
    .await;
    Ok(())
}

/// Scale-only mode: writes the target's replicas through `/scale` when the decision changes them. A
/// refused write (the target deleted meanwhile, RBAC) becomes what `read` says, for ScalingActive, and
/// never fails the reconcile: status, the alarm and redrive still run. The note of the Scaled Event.
async fn scale_target_write(
    ctx: &Context,
    ns: &str,
    t: &crate::api::ScaleTargetRef,
    replicas: &ReplicaDecision,
    read: &mut target::TargetRead,
) -> Option<String> {
    let n = replicas.write()?;
    let why = scale_note(
        replicas,
        n,
        "its pods stop as its own controller stops them",
    );
    match target::scale(&ctx.client, ns, t, n).await {
        Ok(written) => {
            ctx.metrics.scale_writes.fetch_add(1, Ordering::Relaxed);
            *read = target::TargetRead::Found(written);
            Some(format!("scaled {} {why}", t.describe()))
        }
        Err(refused) => {
            *read = refused;
            None
        }
    }
}

/// Server-side apply of the status subresource, as the controller's field manager.
async fn write_status(
    ctx: &Context,
    qcs: &Api<QueueConsumer>,
    name: &str,
    status: &QueueConsumerStatus,
    cause: status::WriteCause,
) -> Result<QueueConsumer, Error> {
    let patch = json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "status": status,
    });
    let written = qcs
        .patch_status(
            name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(Error::WriteStatus)?;
    ctx.metrics.status_written(cause);
    Ok(written)
}

/// Events of the alarm step: its write, and its failure (also counted as a reconcile error).
async fn alarm_events(
    qc: &QueueConsumer,
    ctx: &Context,
    change: &AlarmChange,
    status: &AlarmStatus,
) {
    match change {
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
    if let status::AlarmSync::Failed { reason, message } = &status.sync {
        ctx.metrics.error(reason);
        ctx.event(qc, true, reason, message.clone()).await;
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
        |from| ctx.workers.deleted_since(&key, from),
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

/// A step failed that does not stop the others: a Warning Event and the error counter, no backoff.
async fn step_failed(ctx: &Context, qc: &QueueConsumer, e: &Error) {
    ctx.metrics.error(e.reason());
    tracing::warn!(queueconsumer = %name_of(qc), error = %e, "reconcile step failed");
    ctx.event(qc, true, e.reason(), e.to_string()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The map of statuses not yet seen in the watch cache fills for every QueueConsumer in a
    /// catch-up and then empties: its table must give the memory back as it does.
    #[test]
    fn a_map_that_empties_out_gives_its_table_back() {
        let mut m: HashMap<String, u64> = (0..10_000).map(|i| (i.to_string(), i)).collect();
        let full = m.capacity();
        for i in 0..9_990u64 {
            m.remove(&i.to_string());
            shrink_sparse(&mut m);
        }
        assert_eq!(m.len(), 10);
        assert!(m.capacity() < 64 * 2, "capacity {} of {full}", m.capacity());
    }
}
