//! `qc-operator plan`: what the controller would apply (the Deployment) and the status it would write,
//! through the same validate → build → decide → status steps as a reconcile, without a cluster.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::json;

use crate::api::{API_VERSION, KIND, QueueConsumer, QueueConsumerStatus};
use crate::render::RenderOptions;

use super::apply;
use super::pipeline::{self, AlarmPlan, Observation, ReplicaDecision, Rollout};
use super::status::{self, AlarmStatus, StatusInputs};

/// The plan for one QueueConsumer.
#[derive(Clone, Debug)]
pub struct Planned {
    pub name: String,
    /// The Deployment that would be applied; None when rollout is held.
    pub deployment: Option<Deployment>,
    /// Why nothing would be applied.
    pub held: Option<String>,
    pub status: QueueConsumerStatus,
    pub has_errors: bool,
}

/// Why a plan cannot be printed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("encode the plan of {name} as YAML: {message}")]
    EncodeYaml { name: String, message: String },
}

/// Plan one QueueConsumer as if it had just been created: no live Deployment, no earlier status.
pub fn plan(
    qc: &QueueConsumer,
    facts: Observation<'_>,
    opts: &RenderOptions,
    now: Time,
) -> Planned {
    let name = qc.metadata.name.clone().unwrap_or_default();
    let decision = pipeline::decide(qc, facts, None, opts);
    let (deployment, held) = match &decision.rollout {
        Rollout::Apply(d) => (Some(apply::with_fingerprint((**d).clone())), None),
        held => (None, Some(why_held(held))),
    };
    let alarm = match &decision.alarm {
        AlarmPlan::Keep(a) => AlarmStatus {
            name: Some(a.name.clone()),
            state: None,
            // `plan` asks CloudWatch nothing about the alarm.
            sync: status::AlarmSync::NotChecked,
        },
        _ => AlarmStatus::default(),
    };
    let mut fresh = qc.clone();
    fresh.status = None;
    let status = status::build(&StatusInputs {
        qc: &fresh,
        facts,
        report: &decision.report,
        rollout: &decision.rollout,
        deployment: deployment.as_ref(),
        target: None,
        alarm,
        applied: None,
        // plan has no sample history: it shows the Deployment, not a scaling decision.
        replicas: &ReplicaDecision::Keep,
        scaled_at: None,
        sampled_at: facts.facts().map(|_| now.clone()),
        redrive: None,
        redrive_after_recovery: None,
        workers: None,
        now,
    });
    Planned {
        name,
        deployment,
        held,
        has_errors: decision.report.has_errors() || decision.rollout.render_error().is_some(),
        status,
    }
}

/// Why `plan` shows no Deployment: a spec that cannot be rendered is said first.
fn why_held(rollout: &Rollout) -> String {
    if let Some(e) = rollout.render_error() {
        return format!("the spec cannot be rendered: {e}");
    }
    match rollout {
        Rollout::HeldByValidation => "held: an Error finding and validation.enforce is true",
        Rollout::HeldForeignDeployment => "held: a Deployment of this name belongs to someone else",
        Rollout::ScaleOnly => {
            "scale-only mode: no Deployment is rendered; the controller scales spec.scaleTargetRef through /scale"
        }
        _ => "held: the queue could not be read, so nothing would change",
    }
    .to_string()
}

/// The plan as multi-document YAML: the Deployment, then the QueueConsumer's status (a document
/// `kubectl` would not accept, but schema validators skip a kind they do not know).
pub fn to_yaml(p: &Planned, namespace: Option<&str>) -> Result<String, PlanError> {
    let encode = |v: &serde_json::Value| {
        serde_saphyr::to_string(v).map_err(|e| PlanError::EncodeYaml {
            name: p.name.clone(),
            message: e.to_string(),
        })
    };
    let mut out = String::new();
    match (&p.deployment, &p.held) {
        (Some(d), _) => {
            out.push_str(&format!(
                "# Deployment the controller would apply for {}\n",
                p.name
            ));
            let v = serde_json::to_value(d).map_err(|e| PlanError::EncodeYaml {
                name: p.name.clone(),
                message: e.to_string(),
            })?;
            out.push_str(&encode(&v)?);
        }
        (None, Some(why)) => {
            out.push_str(&format!("# No Deployment for {}: {why}\n", p.name));
        }
        (None, None) => {}
    }
    out.push_str("---\n");
    out.push_str(&format!(
        "# Status the controller would write for {}\n",
        p.name
    ));
    let mut metadata = json!({"name": p.name});
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    let status_doc = json!({
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "status": p.status,
    });
    out.push_str(&encode(&status_doc)?);
    Ok(out)
}

/// The result of `plan FILE`: the text to print, errors for stderr, and the exit code
/// (0 planned, 1 an Error finding, 2 unreadable or invalid input, as `check`).
#[derive(Clone, Debug, Default)]
pub struct PlanRun {
    pub output: String,
    pub errors: Vec<String>,
    pub exit_code: u8,
}

/// Plan every QueueConsumer of a manifest file, with facts from `source`.
pub async fn run_file(
    path: &std::path::Path,
    source: &crate::check::FactsSource,
    opts: &RenderOptions,
) -> PlanRun {
    use crate::check::FactsSource;
    use crate::manifest::{self, Document};

    let mut run = PlanRun::default();
    let docs = match manifest::load_file(path) {
        Ok(d) => d,
        Err(e) => {
            run.errors.push(e.to_string());
            run.exit_code = 2;
            return run;
        }
    };
    let mut planned_any = false;
    for doc in docs {
        let qc = match doc {
            Document::Valid(qc) => *qc,
            Document::Invalid { name, errors } => {
                for e in errors {
                    run.errors.push(format!("{}: {name}: {e}", path.display()));
                }
                run.exit_code = 2;
                continue;
            }
            Document::Other { .. } => continue,
        };
        planned_any = true;
        let name = qc.metadata.name.clone().unwrap_or_default();
        let read = match source {
            FactsSource::Offline => None,
            FactsSource::Files {
                source,
                dead_letter,
            } => Some(
                manifest::facts_from_files(source, dead_letter.as_deref(), &qc.spec.queue.url)
                    .map_err(|e| e.to_string()),
            ),
            FactsSource::Live(_) => Some(match source.refuse_endpoint(&qc) {
                Ok(()) => live_facts(&qc).await,
                Err(e) => Err(e),
            }),
        };
        let observation = match &read {
            None => Observation::Offline,
            Some(Ok(f)) => Observation::Read(f),
            Some(Err(e)) => {
                // A file or endpoint problem is bad input: no plan rather than a plan of an outage.
                run.errors.push(format!("{name}: {e}"));
                run.exit_code = 2;
                continue;
            }
        };
        let planned = plan(&qc, observation, opts, super::observe::now());
        if planned.has_errors && run.exit_code == 0 {
            run.exit_code = 1;
        }
        match to_yaml(&planned, qc.metadata.namespace.as_deref()) {
            Ok(y) => {
                if !run.output.is_empty() {
                    run.output.push_str("---\n");
                }
                run.output.push_str(&y);
            }
            Err(e) => {
                run.errors.push(e.to_string());
                run.exit_code = 2;
            }
        }
    }
    if !planned_any && run.errors.is_empty() {
        run.errors
            .push(format!("{}: no QueueConsumer in the file", path.display()));
        run.exit_code = 2;
    }
    run
}

/// `--live`: the queue, its DLQ and the DLQ's oldest-message age, as the controller reads them.
async fn live_facts(qc: &QueueConsumer) -> Result<crate::aws::Facts, String> {
    use super::observe::{AwsProvider, SdkProvider, with_oldest_age};
    let clients = SdkProvider::default()
        .clients(&super::observe::aws_target(qc))
        .await;
    let facts = crate::aws::observe(clients.sqs.as_ref(), &qc.spec.queue.url)
        .await
        .map_err(|e| e.to_string())?;
    Ok(with_oldest_age(facts, clients.alarms.as_ref()).await)
}
