//! The pure middle of a reconcile: validate → build → decide, from a QueueConsumer and its queue facts.
//! `qc-operator plan` and the controller share it, so plan prints exactly what reconcile would apply.

use k8s_openapi::api::apps::v1::Deployment;

use crate::api::{Mode, QueueConsumer};
use crate::aws::cloudwatch::{AlarmSpec, dead_letter_alarm};
use crate::aws::{DeadLetterFacts, Facts, ObserveError};
use crate::render::{self, RenderError, RenderOptions};
use crate::scaling::{self, History, Timestamp};
use crate::validate::{self, Report};

/// What is known about the queue for one decision.
#[derive(Clone, Copy, Debug)]
pub enum Observation<'a> {
    Read(&'a Facts),
    Failed(&'a ObserveError),
    /// `plan` without `--live` or `--attributes`: nothing was read, and nothing failed.
    Offline,
}

impl<'a> Observation<'a> {
    pub fn facts(&self) -> Option<&'a Facts> {
        match self {
            Observation::Read(f) => Some(f),
            _ => None,
        }
    }

    pub fn from_result(r: Result<&'a Facts, &'a ObserveError>) -> Self {
        match r {
            Ok(f) => Observation::Read(f),
            Err(e) => Observation::Failed(e),
        }
    }
}

/// Whether the rendered Deployment goes out (carrying it), and if not, why it is held.
#[derive(Clone, Debug, PartialEq)]
pub enum Rollout {
    Apply(Box<Deployment>),
    /// Scale-only mode (`spec.scaleTargetRef`): nothing is rendered or applied; the scaler scales the
    /// user's own workload through `/scale`.
    ScaleOnly,
    /// The queue could not be read: the Deployment and its replicas stay as they are. The spec may
    /// not render either; `ConfigValid` says so all the same.
    HeldQueueUnreachable {
        render: Result<(), RenderError>,
    },
    /// The spec cannot be rendered.
    HeldInvalidSpec(RenderError),
    /// `validation.enforce` and an Error finding.
    HeldByValidation,
    /// A Deployment of that name exists and another owner (or nobody) controls it: never taken over.
    HeldForeignDeployment,
}

impl Rollout {
    /// The Deployment to apply, when the rollout goes out.
    pub fn deployment(&self) -> Option<&Deployment> {
        match self {
            Rollout::Apply(d) => Some(d),
            _ => None,
        }
    }

    /// Why the spec cannot be rendered, whatever else holds the rollout.
    pub fn render_error(&self) -> Option<&RenderError> {
        match self {
            Rollout::HeldInvalidSpec(e) | Rollout::HeldQueueUnreachable { render: Err(e) } => {
                Some(e)
            }
            _ => None,
        }
    }
}

/// What the controller would do for one QueueConsumer.
#[derive(Clone, Debug)]
pub struct Decision {
    pub report: Report,
    pub rollout: Rollout,
    /// The CloudWatch alarm to keep, when `deadLetter.alarm` is on and the DLQ exists.
    pub alarm: AlarmPlan,
}

/// The scaling step's answer. Render never sets replicas; the reconcile writes `Scale`'s replicas, when
/// they differ from what runs, by a separate apply as field manager `qc-operator-scaler`.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplicaDecision {
    /// Leave `spec.replicas` alone: rollout is held (the hold's reason is `ScalingActive`'s), or no
    /// scaler ran (`plan`).
    Keep,
    /// The policy's answer for a Deployment asking for `current` replicas.
    Scale {
        current: u32,
        decision: scaling::Decision,
    },
    /// `spec.suspend`: 0 replicas for a Deployment asking for `current`, whatever the queue says.
    Suspended { current: u32 },
}

impl ReplicaDecision {
    /// The replicas to write: Some only when the decision changes them.
    pub fn write(&self) -> Option<u32> {
        match self {
            ReplicaDecision::Scale { current, decision } if decision.changes(*current) => {
                Some(decision.replicas)
            }
            ReplicaDecision::Suspended { current } if *current != 0 => Some(0),
            _ => None,
        }
    }
}

/// Whether the DLQ alarm should exist.
#[derive(Clone, Debug, PartialEq)]
pub enum AlarmPlan {
    /// Keep this alarm in sync.
    Keep(Box<AlarmSpec>),
    /// No alarm should exist (alarm off, or no DLQ): delete any this QueueConsumer created.
    Remove,
    /// Not enough is known (queue or DLQ unreadable): leave the alarm as it is.
    Unchanged,
}

/// The alarm's name: unique per QueueConsumer object (the uid tells apart namesakes in other clusters
/// sharing the account, and a recreated QueueConsumer from the one it replaced), within CloudWatch's
/// 255 characters.
pub fn alarm_name(qc: &QueueConsumer) -> String {
    let ns = qc.metadata.namespace.as_deref().unwrap_or("default");
    let name = qc.metadata.name.as_deref().unwrap_or("");
    let uid = qc.metadata.uid.as_deref().unwrap_or("");
    let mut s = format!("qc-dlq-{ns}-{name}");
    // 255 minus a uid and its dash; names are ASCII (DNS labels), so byte truncation is safe.
    s.truncate(218);
    if !uid.is_empty() {
        s.push('-');
        s.push_str(uid);
    }
    s
}

/// Whether the QueueConsumer controls `live` (its controller owner reference carries our uid).
pub fn controls(qc: &QueueConsumer, live: &Deployment) -> bool {
    let uid = qc.metadata.uid.as_deref();
    live.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

/// The bundled worker's rollout: the rendered Deployment, or why it is held.
fn worker_rollout(
    qc: &QueueConsumer,
    facts: Observation<'_>,
    live: Option<&Deployment>,
    opts: &RenderOptions,
    report: &Report,
) -> Rollout {
    match render::deployment(qc, opts) {
        rendered if matches!(facts, Observation::Failed(_)) => Rollout::HeldQueueUnreachable {
            render: rendered.map(|_| ()),
        },
        Err(e) => Rollout::HeldInvalidSpec(e),
        Ok(_) if live.is_some_and(|d| !controls(qc, d)) => Rollout::HeldForeignDeployment,
        Ok(_) if qc.spec.validation.enforce && report.has_errors() => Rollout::HeldByValidation,
        Ok(d) => Rollout::Apply(Box::new(d)),
    }
}

/// Scale-only mode's rollout: nothing to render; held for a spec that mixes the modes, an unreadable
/// queue or an enforced Error finding, as the bundled worker's would be.
fn scale_only_rollout(qc: &QueueConsumer, facts: Observation<'_>, report: &Report) -> Rollout {
    match qc.spec.mode_conflict() {
        Some((_, message, fix)) => {
            Rollout::HeldInvalidSpec(RenderError::ModeConflict(format!("{message}: {fix}")))
        }
        None if matches!(facts, Observation::Failed(_)) => {
            Rollout::HeldQueueUnreachable { render: Ok(()) }
        }
        None if qc.spec.validation.enforce && report.has_errors() => Rollout::HeldByValidation,
        None => Rollout::ScaleOnly,
    }
}

/// Validate, render and decide. `live` is the Deployment of that name, if one exists (the bundled
/// worker's; scale-only mode never reads it).
pub fn decide(
    qc: &QueueConsumer,
    facts: Observation<'_>,
    live: Option<&Deployment>,
    opts: &RenderOptions,
) -> Decision {
    let report = validate::evaluate(&qc.spec, facts.facts());
    let rollout = match qc.spec.mode() {
        Mode::ScaleOnly(_) => scale_only_rollout(qc, facts, &report),
        Mode::Worker => worker_rollout(qc, facts, live, opts, &report),
    };
    let alarm = match facts {
        Observation::Failed(_) | Observation::Offline => AlarmPlan::Unchanged,
        Observation::Read(_) if !qc.spec.dead_letter.alarm => AlarmPlan::Remove,
        Observation::Read(f) => match &f.dead_letter {
            DeadLetterFacts::Found { queue, .. } => AlarmPlan::Keep(Box::new(
                dead_letter_alarm(
                    &alarm_name(qc),
                    &queue.name(),
                    qc.metadata.namespace.as_deref().unwrap_or("default"),
                    qc.metadata.name.as_deref().unwrap_or(""),
                )
                .with_actions(&qc.spec.dead_letter.alarm_actions),
            )),
            DeadLetterFacts::None | DeadLetterFacts::Missing { .. } => AlarmPlan::Remove,
            DeadLetterFacts::Unreachable { .. } | DeadLetterFacts::NotRead { .. } => {
                AlarmPlan::Unchanged
            }
        },
    };
    Decision {
        report,
        rollout,
        alarm,
    }
}

/// The rules again with the observed P99 in place of the declared one (when it is above it). A finding
/// that differs from the declared run says which P99 it used; findings the P99 does not change stay as
/// they were. Rollout holds (`validation.enforce`) stay decided on the declared run: holding replicas
/// because the handler is slow would only make the backlog worse.
pub fn with_observed_p99(
    qc: &QueueConsumer,
    facts: Observation<'_>,
    declared: &Report,
    observed: crate::api::Duration,
) -> Report {
    let mut spec = qc.spec.clone();
    spec.processing.p99 = observed;
    let again = validate::evaluate(&spec, facts.facts());
    let mut findings: Vec<_> = again
        .findings
        .into_iter()
        .map(|mut f| {
            if !declared.findings.contains(&f) {
                f.message.push_str(&format!(
                    " (with the observed P99 {observed}; the declared p99 is {})",
                    qc.spec.processing.p99
                ));
            }
            f
        })
        .collect();
    for f in &declared.findings {
        if !findings.iter().any(|g| g.code == f.code) {
            findings.push(f.clone());
        }
    }
    Report {
        findings,
        skipped: again.skipped,
    }
}

/// What the Deployment asks for: its `spec.replicas`, or the API server's default of 1 when unset.
pub fn current_replicas(d: &Deployment) -> u32 {
    d.spec.replicas.map_or(1, |r| u32::try_from(r).unwrap_or(0))
}

/// The scaling step, after apply. The policy runs only when the Deployment is ours and rolls out: a
/// held rollout holds replicas, so an unreadable queue, an enforced Error finding or someone else's
/// Deployment never zero or flap them. A failed queue read pushed no sample, so when the queue is
/// readable again the policy decides on what it last saw, and says MetricsUnavailable once that is stale.
///
/// `spec.suspend` comes first: a Deployment this QueueConsumer controls goes to 0 even while rollout is
/// held (an unreadable queue or an enforced finding must not keep consumers running that the user
/// stopped, e.g. during an incident); someone else's Deployment is still never touched.
///
/// `asks` is what the workload asks for now: the worker Deployment's replicas (`current_replicas`), or
/// in scale-only mode the target's `/scale`; None when there is none (yet).
///
/// `downstream` is the workers' breakers at their last scrape: while most are open the policy holds
/// replicas (`scaling::decide_for`).
pub fn decide_replicas(
    qc: &QueueConsumer,
    rollout: &Rollout,
    asks: Option<u32>,
    created: bool,
    history: &History,
    downstream: scaling::Downstream,
    now: Timestamp,
) -> ReplicaDecision {
    if qc.spec.suspend
        && !matches!(rollout, Rollout::HeldForeignDeployment)
        && let Some(current) = asks
    {
        return ReplicaDecision::Suspended { current };
    }
    match (rollout, asks) {
        (Rollout::Apply(_) | Rollout::ScaleOnly, Some(current)) => {
            let mut decision = scaling::decide_for(&qc.spec, history, current, downstream, now);
            // The short-history hold keeps replicas that may be busy after a controller restart. A
            // Deployment this reconcile created has no pod yet: when the queue is idle and minReplicas
            // allows it, decide as from zero, rather than keep the API server's default replica for a
            // whole window.
            if created && decision.limited_by == Some(scaling::Limit::ShortHistory) {
                let from_zero = scaling::decide_for(&qc.spec, history, 0, downstream, now);
                if from_zero.replicas == 0
                    && from_zero.reason != scaling::Reason::MetricsUnavailable
                {
                    decision = from_zero;
                }
            }
            ReplicaDecision::Scale { current, decision }
        }
        _ => ReplicaDecision::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scaling::Sample;
    use serde_json::json;

    /// A rollout that applies (the Deployment itself does not matter to these tests).
    /// A 600 s history with one sample at t=10 s.
    fn one_sample(visible: u64, in_flight: u64) -> History {
        let mut h = History::new(crate::api::Duration::from_secs(600));
        h.push(Sample {
            visible,
            in_flight,
            delayed: 0,
            deleted: None,
            oldest_age: None,
            at: Timestamp::from_secs(10),
        })
        .unwrap();
        h
    }

    /// Workers whose breakers are all closed (or none scraped).
    fn healthy() -> scaling::Downstream {
        scaling::Downstream::default()
    }

    fn apply() -> Rollout {
        Rollout::Apply(Box::default())
    }

    fn qc() -> QueueConsumer {
        serde_json::from_value(json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": "orders", "namespace": "shop", "uid": "u1"},
            "spec": {"queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/orders"},
                     "processing": {"p99": "2s"}, "handler": {"http": {}},
                     "template": {"spec": {"containers": [{"name": "app", "image": "x"}]}}}
        }))
        .unwrap()
    }

    fn deployment(replicas: Option<i32>) -> Deployment {
        serde_json::from_value(json!({"metadata": {"name": "orders"},
            "spec": {"replicas": replicas, "selector": {}, "template": {}}}))
        .unwrap()
    }

    #[test]
    fn the_rollout_carries_the_deployment_or_why_it_is_held() {
        let opts = RenderOptions::default();
        let q = qc();
        let err = ObserveError::ReadQueueAttributes {
            url: q.spec.queue.url.clone(),
            source: crate::aws::SqsError::QueueDoesNotExist {
                target: q.spec.queue.url.clone(),
            },
        };
        // Offline, a spec that renders goes out with its Deployment.
        let d = decide(&q, Observation::Offline, None, &opts);
        let Rollout::Apply(rendered) = &d.rollout else {
            panic!("{:?}", d.rollout)
        };
        assert_eq!(rendered.metadata.name.as_deref(), Some("orders"));
        assert_eq!(d.rollout.deployment(), Some(&**rendered));
        assert_eq!(d.rollout.render_error(), None);
        // A spec that cannot render: held, with the reason.
        let mut broken = q.clone();
        broken.spec.handler.http = None;
        let d = decide(&broken, Observation::Offline, None, &opts);
        assert!(
            matches!(d.rollout, Rollout::HeldInvalidSpec(_)),
            "{:?}",
            d.rollout
        );
        assert!(d.rollout.render_error().is_some());
        // The queue unreadable as well: held for the queue, and the render error is still known.
        let d = decide(&broken, Observation::Failed(&err), None, &opts);
        assert!(
            matches!(d.rollout, Rollout::HeldQueueUnreachable { render: Err(_) }),
            "{:?}",
            d.rollout
        );
        assert!(d.rollout.render_error().is_some());
        assert_eq!(d.rollout.deployment(), None);
        let d = decide(&q, Observation::Failed(&err), None, &opts);
        assert_eq!(d.rollout, Rollout::HeldQueueUnreachable { render: Ok(()) });
    }

    #[test]
    fn only_a_rollout_that_applies_is_scaled() {
        let q = qc();
        let h = one_sample(900, 0);
        let now = Timestamp::from_secs(11);
        let d = deployment(Some(1));
        for held in [
            Rollout::HeldQueueUnreachable { render: Ok(()) },
            Rollout::HeldInvalidSpec(RenderError::NoHandler),
            Rollout::HeldByValidation,
            Rollout::HeldForeignDeployment,
        ] {
            let r = decide_replicas(
                &q,
                &held,
                Some(current_replicas(&d)),
                false,
                &h,
                healthy(),
                now,
            );
            assert_eq!(r, ReplicaDecision::Keep, "{held:?}");
            assert_eq!(r.write(), None);
        }
        assert_eq!(
            decide_replicas(&q, &apply(), None, false, &h, healthy(), now),
            ReplicaDecision::Keep
        );
        // 900 visible at 300 per replica: 3, from 1.
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &h,
            healthy(),
            now,
        );
        assert_eq!(r.write(), Some(3));
        // Already at 3: nothing to write.
        let r = decide_replicas(&q, &apply(), Some(3), false, &h, healthy(), now);
        assert!(matches!(r, ReplicaDecision::Scale { current: 3, .. }));
        assert_eq!(r.write(), None);
    }

    #[test]
    fn suspend_zeroes_our_deployment_even_while_rollout_is_held() {
        let mut q = qc();
        q.spec.suspend = true;
        let h = History::new(crate::api::Duration::from_secs(600));
        let now = Timestamp::from_secs(11);
        for rollout in [
            apply(),
            Rollout::HeldQueueUnreachable { render: Ok(()) },
            Rollout::HeldInvalidSpec(RenderError::NoHandler),
            Rollout::HeldByValidation,
        ] {
            let r = decide_replicas(&q, &rollout, Some(3), false, &h, healthy(), now);
            assert_eq!(r, ReplicaDecision::Suspended { current: 3 }, "{rollout:?}");
            assert_eq!(r.write(), Some(0));
            // Already at zero: nothing to write.
            let r = decide_replicas(&q, &rollout, Some(0), false, &h, healthy(), now);
            assert_eq!(r.write(), None);
        }
        // Someone else's Deployment is never touched, suspended or not; no Deployment, nothing to do.
        let d = deployment(Some(3));
        let r = decide_replicas(
            &q,
            &Rollout::HeldForeignDeployment,
            Some(current_replicas(&d)),
            false,
            &h,
            healthy(),
            now,
        );
        assert_eq!(r, ReplicaDecision::Keep);
        assert_eq!(
            decide_replicas(&q, &apply(), None, false, &h, healthy(), now),
            ReplicaDecision::Keep
        );
    }

    #[test]
    fn a_deployment_just_created_on_an_idle_queue_goes_to_zero_at_once() {
        let mut q = qc();
        q.spec.scaling.min_replicas = 0;
        let now = Timestamp::from_secs(11);
        // The API server defaulted the new Deployment to 1 replica.
        let d = deployment(None);
        let idle = one_sample(0, 0);
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            true,
            &idle,
            healthy(),
            now,
        );
        assert_eq!(r.write(), Some(0), "{r:?}");
        // The same Deployment found (not created) after a restart: held for the window.
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &idle,
            healthy(),
            now,
        );
        assert_eq!(r.write(), None, "{r:?}");
        assert!(matches!(
            &r,
            ReplicaDecision::Scale { decision, .. }
                if decision.limited_by == Some(scaling::Limit::ShortHistory)
        ));
        // Work in flight or waiting: the new replica stays.
        for h in [one_sample(0, 3), one_sample(2, 0)] {
            let r = decide_replicas(
                &q,
                &apply(),
                Some(current_replicas(&d)),
                true,
                &h,
                healthy(),
                now,
            );
            assert_ne!(r.write(), Some(0), "{r:?}");
        }
        // minReplicas 2: up to 2 as before, created or not.
        q.spec.scaling.min_replicas = 2;
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            true,
            &idle,
            healthy(),
            now,
        );
        assert_eq!(r.write(), Some(2));
        // No usable sample: nothing written.
        let stale = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            true,
            &idle,
            healthy(),
            Timestamp::from_secs(100_000),
        );
        assert_eq!(stale.write(), None, "{stale:?}");
    }

    #[test]
    fn most_workers_open_hold_replicas_in_both_directions() {
        let q = qc();
        let now = Timestamp::from_secs(11);
        let open = |open, scraped| scaling::Downstream {
            open,
            scraped,
            fifo_groups: None,
            dwell: None,
        };
        // 900 visible ask for 3; 0 visible ask for fewer than 2 (after the window).
        let busy = one_sample(900, 0);
        let d = deployment(Some(2));
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &busy,
            healthy(),
            now,
        );
        assert_eq!(r.write(), Some(3), "healthy: scales out");
        // 2 of 3 open: held at 2, the queue's 3 only reported.
        for failing in [open(2, 3), open(1, 1), open(2, 2)] {
            let r = decide_replicas(
                &q,
                &apply(),
                Some(current_replicas(&d)),
                false,
                &busy,
                failing,
                now,
            );
            assert_eq!(r.write(), None, "{failing:?}: {r:?}");
            let ReplicaDecision::Scale { decision, .. } = &r else {
                panic!("{r:?}")
            };
            assert_eq!(decision.reason, scaling::Reason::DownstreamFailing);
            assert_eq!(decision.recommended, 3);
            assert_eq!(decision.condition_reason(), "DownstreamFailing");
            assert!(
                decision.to_string().contains("would ask for 3"),
                "{decision}"
            );
        }
        // Half, or fewer, open: the queue decides.
        for not_most in [open(1, 2), open(1, 3), open(0, 0)] {
            let r = decide_replicas(
                &q,
                &apply(),
                Some(current_replicas(&d)),
                false,
                &busy,
                not_most,
                now,
            );
            assert_eq!(r.write(), Some(3), "{not_most:?}");
        }
        // No scale-in either: an idle queue (the paused workers hold their messages) keeps 2.
        let mut idle = History::new(crate::api::Duration::from_secs(600));
        for t in [10, 40, 70, 100] {
            idle.push(Sample {
                visible: 0,
                in_flight: 0,
                delayed: 0,
                deleted: None,
                oldest_age: None,
                at: Timestamp::from_secs(t),
            })
            .unwrap();
        }
        let later = Timestamp::from_secs(101);
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &idle,
            healthy(),
            later,
        );
        assert!(
            r.write().is_some_and(|n| n < 2),
            "healthy: scales in: {r:?}"
        );
        let r = decide_replicas(
            &q,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &idle,
            open(2, 2),
            later,
        );
        assert_eq!(r.write(), None, "{r:?}");
        // Suspend still wins.
        let mut suspended = q.clone();
        suspended.spec.suspend = true;
        let r = decide_replicas(
            &suspended,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &busy,
            open(2, 2),
            now,
        );
        assert_eq!(r.write(), Some(0));
        // maxReplicas lowered during the incident is honoured.
        let mut lowered = q.clone();
        lowered.spec.scaling.max_replicas = 1;
        let r = decide_replicas(
            &lowered,
            &apply(),
            Some(current_replicas(&d)),
            false,
            &busy,
            open(2, 2),
            now,
        );
        assert_eq!(r.write(), Some(1));
    }

    #[test]
    fn current_replicas_defaults_like_the_api_server() {
        assert_eq!(current_replicas(&deployment(None)), 1);
        assert_eq!(current_replicas(&deployment(Some(0))), 0);
        assert_eq!(current_replicas(&deployment(Some(-2))), 0);
        assert_eq!(current_replicas(&deployment(Some(7))), 7);
    }
    fn scale_only(q: &QueueConsumer) -> QueueConsumer {
        let mut q = q.clone();
        q.spec.handler = crate::api::HandlerSpec::default();
        q.spec.template = k8s_openapi::api::core::v1::PodTemplateSpec::default();
        q.spec.scale_target_ref = Some(crate::api::ScaleTargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "legacy-orders".into(),
        });
        q
    }

    #[test]
    fn scale_only_renders_nothing_and_scales_the_target() {
        let opts = RenderOptions::default();
        let q = scale_only(&qc());
        let d = decide(&q, Observation::Offline, None, &opts);
        assert_eq!(d.rollout, Rollout::ScaleOnly);
        assert_eq!(d.rollout.deployment(), None);
        assert_eq!(d.rollout.render_error(), None);
        // A Deployment named like the QueueConsumer is never looked at in this mode.
        let theirs = deployment(Some(2));
        assert_eq!(
            decide(&q, Observation::Offline, Some(&theirs), &opts).rollout,
            Rollout::ScaleOnly
        );
        // Mixed with the bundled worker's fields: held, naming them.
        let mut mixed = q.clone();
        mixed.spec.handler = qc().spec.handler;
        let d = decide(&mixed, Observation::Offline, None, &opts);
        let Some(RenderError::ModeConflict(m)) = d.rollout.render_error() else {
            panic!("{:?}", d.rollout)
        };
        assert!(
            m.contains("excludes handler") && m.contains("Deployment/legacy-orders"),
            "{m}"
        );
        // The queue unreadable: held like the worker's rollout.
        let err = ObserveError::ReadQueueAttributes {
            url: q.spec.queue.url.clone(),
            source: crate::aws::SqsError::QueueDoesNotExist {
                target: q.spec.queue.url.clone(),
            },
        };
        assert_eq!(
            decide(&q, Observation::Failed(&err), None, &opts).rollout,
            Rollout::HeldQueueUnreachable { render: Ok(()) }
        );
        // The policy runs on what the target asks for; suspend zeroes it; no target, nothing.
        let h = one_sample(900, 0);
        let now = Timestamp::from_secs(11);
        let r = decide_replicas(&q, &Rollout::ScaleOnly, Some(1), false, &h, healthy(), now);
        assert_eq!(r.write(), Some(3));
        assert_eq!(
            decide_replicas(&q, &Rollout::ScaleOnly, None, false, &h, healthy(), now),
            ReplicaDecision::Keep
        );
        let mut suspended = q.clone();
        suspended.spec.suspend = true;
        let r = decide_replicas(
            &suspended,
            &Rollout::ScaleOnly,
            Some(3),
            false,
            &h,
            healthy(),
            now,
        );
        assert_eq!(r, ReplicaDecision::Suspended { current: 3 });
    }
}
