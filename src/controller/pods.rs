//! The worker pods in a reconcile: list them, read their /metrics when due, mark idle ones for a
//! scale-down (pod deletion cost), and measure their start-up for `scaleDownStabilization: auto`.
//! None of this fails a reconcile: what cannot be read is logged and left out.

use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;

use crate::api::QueueConsumer;

use super::apply::SCALER_FIELD_MANAGER;
use super::status::{self, Workers};
use super::{ConsumerKey, Context, name_of, observe, scale, workers};

/// The worker pods (None when they could not be listed) and what their /metrics say. Scrapes when one
/// is due (once per pollInterval, the second one sooner: `workers::warm_up`) or `now`. Never fails the reconcile: a pod list or scrape that fails
/// leaves the observation without those pods (logged), and scaling goes on.
pub(super) async fn read_workers(
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
        && (now
            || ctx
                .workers
                .due(&id, qc.spec.scaling.poll_interval, observe::wall_clock()))
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
        breaker_open: latest.map_or(0, workers::Round::breaker_open),
        fifo: latest.and_then(workers::Round::fifo),
        dwell: qc
            .spec
            .scaling
            .objective
            .as_ref()
            .and_then(|o| window.as_ref().and_then(|w| w.dwell(o.dwell_p99))),
        sampled_at: latest.map(|r| timestamp_time(r.at)),
        crash_looping: pods
            .as_deref()
            .map(workers::crash_looping)
            .unwrap_or_default(),
        warming_up: window
            .as_ref()
            .is_none_or(|w| !workers::scrape_due(w.span(), qc.spec.scaling.poll_interval.as_std())),
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
pub(super) async fn set_deletion_costs(
    qc: &QueueConsumer,
    ctx: &Context,
    ns: &str,
    pods: Option<&[Pod]>,
) {
    let Some(pods) = pods else { return };
    let window = ctx.workers.get(&ConsumerKey::of(qc));
    let busy = i64::from(qc.spec.processing.concurrency);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for (pod, cost) in workers::deletion_costs(pods, window.as_ref().and_then(|w| w.latest()), busy)
    {
        if annotate(&api, &pod, workers::DELETION_COST, &cost.to_string())
            .await
            .map_err(|e| tracing::warn!(queueconsumer = %name_of(qc), pod, error = %e, "cannot set the pod deletion cost"))
            .is_ok()
        {
            ctx.metrics
                .deletion_cost_writes
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Sets one annotation on a worker pod, as field manager `qc-operator-scaler`, with a merge patch:
/// it can never create a pod that went away meanwhile.
async fn annotate(api: &Api<Pod>, pod: &str, key: &str, value: &str) -> Result<(), kube::Error> {
    let params = PatchParams {
        field_manager: Some(SCALER_FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(pod, &params, &Patch::Merge(&patch))
        .await
        .map(drop)
}

/// `processing.maxRate`: each running worker pod's share (`scaling::rate::SHARE_ANNOTATION`),
/// maxRate / the pods that may start messages ([`crate::scaling::rate::share_count`]), written as
/// field manager `qc-operator-scaler` where it differs; the worker reads it through its downward-API
/// file, without a restart. A merge patch (it never recreates a pod gone meanwhile); a failure is
/// logged and retried at the next reconcile. Pods created by this reconcile's scale-up are
/// annotated at the next one and run at maxRate / maxReplicas until then.
pub(super) async fn set_rate_shares(
    qc: &QueueConsumer,
    ctx: &Context,
    ns: &str,
    pods: Option<&[Pod]>,
    current: u32,
    target: u32,
) {
    let (Some(max_rate), Some(pods)) = (qc.spec.processing.max_rate, pods) else {
        return;
    };
    let running: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_none_or(|phase| phase != "Succeeded" && phase != "Failed")
        })
        .collect();
    let n = crate::scaling::rate::share_count(current, target, running.len());
    let text = crate::scaling::rate::share_text(crate::scaling::rate::share(max_rate, n));
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    for pod in running {
        if pod
            .annotations()
            .get(crate::scaling::rate::SHARE_ANNOTATION)
            == Some(&text)
        {
            continue;
        }
        let name = pod.name_any();
        if annotate(&api, &name, crate::scaling::rate::SHARE_ANNOTATION, &text)
            .await
            .map_err(|e| tracing::warn!(queueconsumer = %name_of(qc), pod = %name, error = %e, "cannot write the pod's rate share"))
            .is_ok()
        {
            ctx.metrics
                .rate_share_writes
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// `scaleDownStabilization: auto` holds for the pods' start-up: now and then ([`scale::STARTUP_REFRESH`])
/// keep the median creation → Ready of the recent worker pods, from this reconcile's pod list. A failed
/// list (e.g. an install whose role cannot list pods) keeps what was known, 30s until then: the hold
/// never blocks a reconcile.
pub(super) fn measure_startup(qc: &QueueConsumer, ctx: &Context, pods: Option<&[Pod]>) {
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
