//! The QueueConsumer CRD on a real Kubernetes API server (the upstream apiextensions-apiserver that
//! `scripts/test` starts): it installs without warnings, the server defaults every sample and valid
//! manifest exactly as the Rust types do, and `kubectl get qc` and `kubectl explain` work.
//! The invalid manifests (server and `check` naming the same field) are in tests/manifest_errors.rs.

mod common;

use std::path::Path;

use common::k8s;
use kube::api::{Api, Patch, PatchParams, PostParams};
use qc::api::QueueConsumer;
use qc::manifest::{Document, load_str};
use serde_json::{Value, json};

fn repo(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap()
}

/// The CRD document with its group renamed to one no other test uses: a create of a CRD that does not
/// exist yet is where the API server reports every schema warning (an update warns only about what
/// the update adds), and a dry run leaves nothing behind.
fn renamed(crd_yaml: &str, group: &str) -> String {
    let mut crd: Value = serde_saphyr::from_str(crd_yaml).unwrap();
    crd["spec"]["group"] = json!(group);
    crd["metadata"]["name"] = json!(format!("queueconsumers.{group}"));
    serde_json::to_string(&crd).unwrap()
}

/// The chart's copy of the CRD as helm renders it.
fn chart_crd() -> Option<String> {
    let helm = [
        std::env::var_os("HOME")
            .map(|h| Path::new(&h).join(".cache/queue-consumer-operator/bin/helm")),
        Some("helm".into()),
    ]
    .into_iter()
    .flatten()
    .find(|p| {
        std::process::Command::new(p)
            .arg("version")
            .output()
            .is_ok()
    })?;
    let out = std::process::Command::new(helm)
        .args([
            "template",
            "qc",
            "charts/queue-consumer-operator",
            "--show-only",
            "templates/crd.yaml",
        ])
        .current_dir(repo(""))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8(out.stdout).unwrap())
}

#[test]
fn the_crd_and_the_charts_copy_install_without_warnings() {
    let test = "the_crd_and_the_charts_copy_install_without_warnings";
    let Some(kubeconfig) = k8s::kubeconfig(test) else {
        return;
    };
    let Some(kubectl) = k8s::kubectl(test) else {
        return;
    };
    let mut copies = vec![("crds/", read("crds/queueconsumers.sqs.consumers.dev.yaml"))];
    match chart_crd() {
        Some(c) => copies.push(("the chart", c)),
        None => assert!(
            std::env::var("QC_REQUIRE_HELM").as_deref() != Ok("1"),
            "helm is required (QC_REQUIRE_HELM=1) but not found"
        ),
    }
    for (i, (which, yaml)) in copies.iter().enumerate() {
        let group = format!("c{}x{i}.sqs.consumers.dev", std::process::id());
        let (ok, out, err) = k8s::run_kubectl(
            &kubectl,
            &kubeconfig,
            &["create", "--dry-run=server", "-f", "-"],
            Some(&renamed(yaml, &group)),
        );
        assert!(ok, "{which}: the API server refused the CRD: {err}");
        assert!(out.contains("created (server dry run)"), "{which}: {out}");
        assert!(
            !err.contains("Warning"),
            "{which}: the API server warns about the CRD:\n{err}"
        );
    }
    // And installed for real, as the README tells a user to.
    let (ok, _, err) = k8s::run_kubectl(
        &kubectl,
        &kubeconfig,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            repo("crds/queueconsumers.sqs.consumers.dev.yaml")
                .to_str()
                .unwrap(),
        ],
        None,
    );
    assert!(ok && !err.contains("Warning"), "{err}");
    let (ok, _, err) = k8s::run_kubectl(
        &kubectl,
        &kubeconfig,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/queueconsumers.sqs.consumers.dev",
        ],
        None,
    );
    assert!(ok, "{err}");
}

/// Every QueueConsumer the repository ships or the tests call valid: the samples, the scaling
/// benchmark's spec, and the smallest manifests of the tests.
fn valid_manifests() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut samples: Vec<_> = std::fs::read_dir(repo("config/samples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("kustomization.yaml")
        })
        .collect();
    samples.sort();
    assert!(samples.len() >= 3, "{samples:?}");
    for p in samples.iter().chain([&repo("benches/scaling/spec.yaml")]) {
        out.push((
            p.strip_prefix(repo("")).unwrap().display().to_string(),
            std::fs::read_to_string(p).unwrap(),
        ));
    }
    let base = "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: x}\nspec:\n  queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n";
    for (name, extra) in [
        (
            "minimal http (tests/manifest_errors.rs)",
            "  handler: {http: {}}\n  processing: {p99: 1s}\n",
        ),
        (
            "exec with alarm off (tests/controller_run.rs)",
            "  processing: {p99: 1s, concurrency: 4}\n  handler: {exec: {command: [/h]}}\n  template: {spec: {containers: [{name: app, image: 'app:1'}]}}\n  deadLetter: {alarm: false}\n",
        ),
        (
            "breaker settings (tests/data/breaker_off.yaml's fields, on)",
            "  handler: {http: {}}\n  processing: {p99: 2s, outageTolerance: 1h, breaker: {failurePercent: 80, window: 40, consecutiveFailures: 5, probeBackoff: {base: 500ms, max: 1m}}}\n",
        ),
        (
            "an AWS role (tests/tenancy.rs)",
            "  handler: {http: {}}\n  processing: {p99: 1s}\n  aws: {roleArn: 'arn:aws:iam::123456789012:role/qc-team-a-orders'}\n",
        ),
        (
            "alarm actions (tests/controller_reconcile.rs)",
            "  handler: {http: {}}\n  processing: {p99: 1s}\n  deadLetter: {alarmActions: ['arn:aws:sns:us-east-1:123456789012:oncall']}\n",
        ),
        (
            "every section set (tests/controller_reconcile.rs)",
            "  processing: {p99: 2s, timeout: 10s, waitTime: 1s}\n  handler: {http: {port: 8080, path: /messages}}\n  template: {spec: {containers: [{name: app, image: 'shop/orders:1'}]}}\n  scaling: {pollInterval: 1s, minReplicas: 1}\n  deadLetter: {alarm: true}\n",
        ),
    ] {
        out.push((name.to_string(), format!("{base}{extra}")));
    }
    out
}

/// Leaf paths (dot-joined) where two JSON values differ; durations compare by value ("90s" = "1m30s").
fn differences(path: &str, a: Option<&Value>, b: Option<&Value>, out: &mut Vec<String>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let keys: std::collections::BTreeSet<_> = x.keys().chain(y.keys()).collect();
            for k in keys {
                differences(&format!("{path}.{k}"), x.get(k), y.get(k), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differences(&format!("{path}[{i}]"), Some(p), Some(q), out);
            }
        }
        (Some(Value::String(x)), Some(Value::String(y)))
            if x.parse::<qc::api::Duration>().ok().is_some()
                && x.parse::<qc::api::Duration>().ok() == y.parse::<qc::api::Duration>().ok() => {}
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: server {a:?}, Rust {b:?}")),
    }
}

#[tokio::test]
async fn the_server_defaults_every_valid_manifest_as_the_rust_types_do() {
    let test = "the_server_defaults_every_valid_manifest_as_the_rust_types_do";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let api = real.queue_consumers();
    let mut failures = Vec::new();
    for (name, text) in valid_manifests() {
        let docs = load_str(&text).unwrap();
        let [Document::Valid(rust)] = docs.as_slice() else {
            panic!("{name}: `check` does not find it valid: {docs:?}")
        };
        let mut sent: Value = serde_saphyr::from_str(&text).unwrap();
        sent["metadata"]["namespace"] = json!(real.namespace);
        let obj_name = sent["metadata"]["name"].as_str().unwrap().to_string();
        let served = k8s::kubectl_dry_apply(&api, &obj_name, &sent)
            .await
            .unwrap_or_else(|e| panic!("{name}: the API server rejects it: {e}"));
        let served = serde_json::to_value(&served).unwrap();
        // Field by field: every field the Rust defaults fill, the server fills with the same value,
        // and the server adds nothing the Rust types do not know.
        let rust_spec = serde_json::to_value(&rust.spec).unwrap();
        let mut diff = Vec::new();
        differences("spec", served.get("spec"), Some(&rust_spec), &mut diff);
        // The pod template is open in the schema (x-kubernetes-preserve-unknown-fields): the server
        // keeps it as sent; the Rust side parses it as a PodTemplateSpec.
        diff.retain(|d| !d.starts_with("spec.template"));
        if !diff.is_empty() {
            failures.push(format!("{name}:\n  {}", diff.join("\n  ")));
        }
        // And what the server stored reads back into the same Rust value.
        let back: QueueConsumer = serde_json::from_value(served.clone())
            .unwrap_or_else(|e| panic!("{name}: the served object does not parse: {e}"));
        assert_eq!(back.spec, rust.spec, "{name}");
    }
    assert!(
        failures.is_empty(),
        "server defaults differ from the Rust defaults:\n{}",
        failures.join("\n")
    );
}

/// The CRD's own rules refuse what `check` refuses in processing.breaker, each naming its field, so
/// `kubectl apply` of a breaker that could never open (or probes in a tight loop) fails at the door.
#[tokio::test]
async fn the_server_refuses_out_of_range_breaker_settings_naming_each_field() {
    let test = "the_server_refuses_out_of_range_breaker_settings_naming_each_field";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let api = real.queue_consumers();
    let base = "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: b}\nspec:\n  queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n  handler: {http: {}}\n";
    for (breaker, field) in [
        ("{failurePercent: 0}", "failurePercent"),
        ("{failurePercent: 101}", "failurePercent"),
        ("{window: 1}", "window"),
        ("{consecutiveFailures: 0}", "consecutiveFailures"),
        (
            "{probeBackoff: {base: 1m, max: 30s}}",
            "probeBackoff.base must not exceed",
        ),
        (
            "{probeBackoff: {base: 10ms}}",
            "probeBackoff.base must be at least 100ms",
        ),
    ] {
        let text = format!("{base}  processing: {{p99: 2s, breaker: {breaker}}}\n");
        let mut sent: Value = serde_saphyr::from_str(&text).unwrap();
        sent["metadata"]["namespace"] = json!(real.namespace);
        let err = k8s::kubectl_dry_apply(&api, "b", &sent)
            .await
            .map(|_| ())
            .expect_err(&format!("the server accepts processing.breaker: {breaker}"));
        let msg = err.to_string();
        assert!(
            msg.contains("breaker") && msg.contains(field),
            "processing.breaker: {breaker}: the refusal does not name {field}: {msg}"
        );
    }
}

#[tokio::test]
async fn kubectl_get_shows_the_columns_and_explain_the_fields() {
    let test = "kubectl_get_shows_the_columns_and_explain_the_fields";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let Some(kubectl) = k8s::kubectl(test) else {
        return;
    };
    let api: Api<QueueConsumer> = Api::namespaced(real.client.clone(), &real.namespace);
    let qc: QueueConsumer = serde_json::from_value(json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": "orders"},
        "spec": {"queue": {"url": "https://sqs.us-east-1.amazonaws.com/1/orders"},
                 "processing": {"p99": "1s"}, "handler": {"http": {}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &qc).await.unwrap();
    api.patch_status(
        "orders",
        &PatchParams::apply("qc-operator").force(),
        &Patch::Apply(json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
            "metadata": {"name": "orders"},
            "status": {
                "replicas": 3, "queue": {"visible": 42, "inFlight": 7},
                "deadLetter": {"visible": 2},
                "conditions": [{"type": "Ready", "status": "True", "reason": "Available",
                                "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
            }
        })),
    )
    .await
    .unwrap();
    let ns = real.namespace.as_str();
    // By the short name and the category too.
    for resource in ["queueconsumers", "qc", "sqs"] {
        let (ok, out, err) = k8s::run_kubectl(
            &kubectl,
            &real.kubeconfig,
            &["get", resource, "-n", ns],
            None,
        );
        assert!(ok, "{resource}: {err}");
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "NAME",
                "READY",
                "REASON",
                "REPLICAS",
                "VISIBLE",
                "INFLIGHT",
                "DLQ",
                "SUSPENDED",
                "AGE"
            ],
            "{resource}: {out}"
        );
        // spec.suspend as the server defaulted it.
        assert_eq!(
            lines[1][..8],
            ["orders", "True", "Available", "3", "42", "7", "2", "false"],
            "{resource}: {out}"
        );
    }
    let (ok, out, err) = k8s::run_kubectl(
        &kubectl,
        &real.kubeconfig,
        &["explain", "qc.spec.processing.batchSize"],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("FIELD: batchSize <integer>"), "{out}");
    assert!(out.contains("MaxNumberOfMessages"), "{out}");
    let (ok, out, err) = k8s::run_kubectl(
        &kubectl,
        &real.kubeconfig,
        &[
            "explain",
            "queueconsumers.status.conditions",
            "--api-version=sqs.consumers.dev/v1alpha1",
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("lastTransitionTime"), "{out}");
    let (ok, out, err) = k8s::run_kubectl(
        &kubectl,
        &real.kubeconfig,
        &["explain", "qc", "--recursive"],
        None,
    );
    assert!(ok, "{err}");
    for field in [
        "queue",
        "processing",
        "handler",
        "scaling",
        "deadLetter",
        "observedGeneration",
    ] {
        assert!(
            out.contains(field),
            "explain --recursive lacks {field}: {out}"
        );
    }
    #[allow(clippy::items_after_statements)] // beside the one walk that uses it
    fn walk(node: &Value, path: &str, out: &mut Vec<String>) {
        if let Some(props) = node.get("properties").and_then(|p| p.as_object()) {
            out.push(path.to_string());
            for (name, child) in props {
                walk(child, &format!("{path}.{name}"), out);
            }
        }
        if let Some(items) = node.get("items") {
            walk(items, path, out);
        }
    }
    // Every object of the schema, explained by the server's own kubectl: no field without a description.
    let crd = serde_json::to_value(qc::api::crd()).unwrap();
    let mut objects = vec![];
    walk(
        &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"],
        "qc",
        &mut objects,
    );
    assert!(objects.len() > 15, "{objects:?}");
    for path in objects {
        let (ok, out, err) =
            k8s::run_kubectl(&kubectl, &real.kubeconfig, &["explain", &path], None);
        assert!(ok, "{path}: {err}");
        assert!(
            !out.contains("<no description>") && !out.contains("<empty>"),
            "kubectl explain {path} shows a field without a description:\n{out}"
        );
    }
}

/// The CRD's own rules refuse a roleArn that is no IAM role, naming the field and an example.
#[tokio::test]
async fn the_server_refuses_a_role_arn_that_is_no_role() {
    let test = "the_server_refuses_a_role_arn_that_is_no_role";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let api = real.queue_consumers();
    let base = "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: r}\nspec:\n  queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n  handler: {http: {}}\n  processing: {p99: 2s}\n";
    for role in [
        "arn:aws:iam::123456789012:user/alice",
        "arn:aws:iam::12345:role/short-account",
        "orders-consumer",
        "arn:aws:iam::123456789012:role/a b",
    ] {
        let text = format!("{base}  aws: {{roleArn: '{role}'}}\n");
        let mut sent: Value = serde_saphyr::from_str(&text).unwrap();
        sent["metadata"]["namespace"] = json!(real.namespace);
        let err = k8s::kubectl_dry_apply(&api, "r", &sent)
            .await
            .map(|_| ())
            .expect_err(&format!("the server accepts aws.roleArn: {role}"));
        let msg = err.to_string();
        assert!(
            msg.contains("aws.roleArn must be an IAM role ARN"),
            "aws.roleArn: {role}: {msg}"
        );
    }
    let mut sent: Value = serde_saphyr::from_str(&format!(
        "{base}  aws: {{roleArn: 'arn:aws-us-gov:iam::123456789012:role/path/qc-orders'}}\n"
    ))
    .unwrap();
    sent["metadata"]["namespace"] = json!(real.namespace);
    k8s::kubectl_dry_apply(&api, "r", &sent).await.unwrap();
}

/// The CRD refuses alarm actions that are no SNS topics, more than CloudWatch takes, or actions of an
/// alarm that is off, naming the field.
#[tokio::test]
async fn the_server_refuses_alarm_actions_cloudwatch_would_not_take() {
    let test = "the_server_refuses_alarm_actions_cloudwatch_would_not_take";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let api = real.queue_consumers();
    let base = "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: a}\nspec:\n  queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n  handler: {http: {}}\n  processing: {p99: 2s}\n";
    let topic = |n: usize| format!("'arn:aws:sns:us-east-1:123456789012:t{n}'");
    let six: Vec<String> = (0..6).map(topic).collect();
    for (dead_letter, says) in [
        (
            "{alarmActions: ['arn:aws:sqs:us-east-1:123456789012:q']}".to_string(),
            "alarmActions",
        ),
        (
            "{alarmActions: ['arn:aws:sns:us-east-1:123456789012:t.fifo']}".to_string(),
            "alarmActions",
        ),
        (
            format!("{{alarmActions: [{}]}}", six.join(", ")),
            "alarmActions",
        ),
        (
            format!("{{alarm: false, alarmActions: [{}]}}", topic(0)),
            "deadLetter.alarmActions needs deadLetter.alarm: true",
        ),
    ] {
        let text = format!("{base}  deadLetter: {dead_letter}\n");
        let mut sent: Value = serde_saphyr::from_str(&text).unwrap();
        sent["metadata"]["namespace"] = json!(real.namespace);
        let err = k8s::kubectl_dry_apply(&api, "a", &sent)
            .await
            .map(|_| ())
            .expect_err(&format!("the server accepts deadLetter: {dead_letter}"));
        let msg = err.to_string();
        assert!(msg.contains(says), "deadLetter: {dead_letter}: {msg}");
    }
}
