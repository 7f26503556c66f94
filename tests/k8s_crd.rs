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

/// Issue 44 item 4: durations as users write them (`1.5s`, `90s`, `1m30s`, `500ms`) pass the real API
/// server, its CEL rules that compare durations read them at their exact value, and `check` agrees;
/// what is no duration is refused by both, the server naming the field, the value and an example.
#[tokio::test]
async fn decimal_durations_pass_and_a_bad_one_is_refused_naming_field_value_and_example() {
    let test = "decimal_durations_pass_and_a_bad_one_is_refused_naming_field_value_and_example";
    let accepted = [
        // (p99, timeout, retryBackoff.base, heartbeat.interval)
        ("1.5s", "90s", "500ms", "auto"),
        ("1.5s", "1500ms", "0.5s", "2.5s"),
        ("0.3s", "300ms", "1m30s", "0.001m"),
        ("0.5m", "0.5m", "1.5m", "1.25s"),
        ("1.999s", "2s", "0.25h", "750ms"),
    ];
    let refused = [
        ("1.5x", "is not a duration"),
        ("1,5s", "is not a duration"),
        ("1.5", "is not a duration"),
        ("1.s", "is not a duration"),
        (".5s", "is not a duration"),
        ("-1s", "is not a duration"),
        ("1.5.5s", "is not a duration"),
        ("1.5ms", "is not a duration"),
        ("1.0005s", "is not a duration"),
    ];
    let doc = |namespace: &str, p99: &str, timeout: &str, base: &str, heartbeat: &str| {
        with(
            with(
                with(
                    with(
                        valid_spec_document(namespace),
                        "/spec/processing/p99",
                        json!(p99),
                    ),
                    "/spec/processing/timeout",
                    json!(timeout),
                ),
                "/spec/processing/retryBackoff",
                json!({"base": base}),
            ),
            "/spec/processing/heartbeat",
            json!({"interval": heartbeat}),
        )
    };
    let check = |d: &Value| {
        load_str(&serde_json::to_string(d).unwrap())
            .unwrap()
            .remove(0)
    };
    for (p99, timeout, base, heartbeat) in accepted {
        match check(&doc("default", p99, timeout, base, heartbeat)) {
            Document::Valid(qc) => {
                assert_eq!(qc.spec.processing.p99, p99.parse().unwrap());
                assert_eq!(qc.spec.processing.timeout, timeout.parse().unwrap());
            }
            other => panic!("check refuses p99 {p99}, timeout {timeout}: {other:?}"),
        }
    }
    for (bad, _) in refused {
        match check(&doc("default", bad, "30s", "5s", "auto")) {
            Document::Invalid { errors, .. } => {
                let e = errors[0].to_string();
                assert!(
                    e.starts_with("spec.processing.p99: ")
                        && e.contains(&format!("{bad:?}"))
                        && e.contains("e.g. "),
                    "check, p99 {bad}: {e}"
                );
            }
            other => panic!("check accepts p99 {bad}: {other:?}"),
        }
    }
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let api = real.queue_consumers();
    for (p99, timeout, base, heartbeat) in accepted {
        let sent = doc(&real.namespace, p99, timeout, base, heartbeat);
        let stored = k8s::kubectl_dry_apply(&api, "rules", &sent)
            .await
            .unwrap_or_else(|e| panic!("the server refuses p99 {p99}, timeout {timeout}, base {base}, heartbeat {heartbeat}: {e}"));
        // Stored as written: the server neither rounds nor rewrites a duration.
        assert_eq!(stored.data["spec"]["processing"]["p99"], json!(p99));
        assert_eq!(
            stored.data["spec"]["processing"]["retryBackoff"]["base"],
            json!(base)
        );
    }
    // A timeout a millisecond under p99 written as a decimal: the server's CEL compares exact values.
    let sent = doc(&real.namespace, "1.001s", "1s", "5s", "auto");
    let err = k8s::kubectl_dry_apply(&api, "rules", &sent)
        .await
        .map(|_| ())
        .expect_err("the server accepts p99 1.001s over timeout 1s");
    assert!(
        err.to_string()
            .contains("processing.p99 must not exceed processing.timeout"),
        "{err}"
    );
    for (bad, says) in refused {
        let sent = doc(&real.namespace, bad, "30s", "5s", "auto");
        let err = k8s::kubectl_dry_apply(&api, "rules", &sent)
            .await
            .map(|_| ())
            .expect_err(&format!("the server accepts p99 {bad}"));
        // The cause on the field itself: its path, the value, and examples of what to write.
        let kube::Error::Api(status) = &err else {
            panic!("p99 {bad}: {err}");
        };
        let cause = status
            .details
            .iter()
            .flat_map(|d| d.causes.iter())
            .find(|c| c.field == "spec.processing.p99");
        assert!(
            cause.is_some_and(|c| c.message.contains(&format!(
                "\"{bad}\" {says}: write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s, 1m30s, 500ms"
            ))),
            "p99 {bad}: the refusal does not name the field, the value and an example: {}",
            status.message
        );
        // Only the field's own refusal: the rule comparing p99 with timeout does not also fail on it.
        assert!(
            !status.message.contains("evaluating rule"),
            "p99 {bad}: a second refusal blames another rule: {}",
            status.message
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

/// #34 item 3: every rule `check` applies to the spec alone (schema, structural limits, CEL rules, the
/// template's containers) as (rule, JSON pointer, bad value, the field the API server names, words of its
/// refusal). A null value removes the field. Each row is refused by the real API server, naming the
/// field, and by `check`.
const SPEC_RULES: &[(&str, &str, &str, &str, &str)] = &[
    (
        "handler or scaleTargetRef required",
        "/spec/handler",
        "null",
        "spec",
        "neither handler nor scaleTargetRef",
    ),
    (
        "scaleTargetRef.name is an object name",
        "/spec/scaleTargetRef",
        r#"{"name": "Bad_Name"}"#,
        "spec.scaleTargetRef.name",
        "should match",
    ),
    (
        "objective.dwellP99 above processing.p99",
        "/spec/scaling",
        r#"{"objective": {"dwellP99": "2s"}}"#,
        "spec",
        "dwellP99 must be greater than processing.p99",
    ),
    (
        "objective.dwellP99 above 0s",
        "/spec/scaling",
        r#"{"objective": {"dwellP99": "0s"}}"#,
        "spec.scaling.objective",
        "dwellP99 must be greater than 0s",
    ),
    (
        "scaleTargetRef excludes handler and template",
        "/spec/scaleTargetRef",
        r#"{"name": "legacy-orders"}"#,
        "spec",
        "excludes handler, template, filter and idempotency.store",
    ),
    (
        "queue.url required",
        "/spec/queue/url",
        r#""""#,
        "spec.queue.url",
        "queue.url",
    ),
    (
        "queue.url is http(s)",
        "/spec/queue/url",
        r#""ftp://q""#,
        "spec.queue",
        "queue.url must be an http(s) URL",
    ),
    (
        "queue.region is a region",
        "/spec/queue/region",
        r#""east""#,
        "spec.queue",
        "queue.region must be an AWS region",
    ),
    (
        "queue.endpoint is http(s)",
        "/spec/queue/endpoint",
        r#""localhost:4566""#,
        "spec.queue",
        "queue.endpoint must be an http(s) URL",
    ),
    (
        "queue.manage is a mode",
        "/spec/queue/manage",
        r#""always""#,
        "spec.queue.manage",
        "Unsupported value",
    ),
    (
        "aws.roleArn is a role",
        "/spec/aws/roleArn",
        r#""orders""#,
        "spec.aws",
        "aws.roleArn must be an IAM role ARN",
    ),
    (
        "processing required",
        "/spec/processing",
        "null",
        "spec.processing",
        "Required value",
    ),
    (
        "processing.p99 is a duration",
        "/spec/processing/p99",
        r#""2x""#,
        "spec.processing.p99",
        "\"2x\" is not a duration: write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s",
    ),
    (
        "p99 <= timeout",
        "/spec/processing/p99",
        r#""40s""#,
        "spec.processing",
        "processing.p99 must not exceed processing.timeout",
    ),
    (
        "waitTime <= 20s",
        "/spec/processing/waitTime",
        r#""21s""#,
        "spec.processing",
        "processing.waitTime must be at most 20s",
    ),
    (
        "batchSize >= 1",
        "/spec/processing/batchSize",
        "0",
        "spec.processing",
        "processing.batchSize must be between 1 and 10",
    ),
    (
        "batchSize <= 10",
        "/spec/processing/batchSize",
        "11",
        "spec.processing",
        "processing.batchSize must be between 1 and 10",
    ),
    (
        "concurrency >= 1",
        "/spec/processing/concurrency",
        "0",
        "spec.processing",
        "processing.concurrency must be at least 1",
    ),
    (
        "concurrency <= 10000",
        "/spec/processing/concurrency",
        "10001",
        "spec.processing",
        "processing.concurrency must be at most 10000",
    ),
    (
        "maxRate >= 1",
        "/spec/processing/maxRate",
        "0",
        "spec.processing",
        "processing.maxRate must be a whole number",
    ),
    (
        "maxRate is whole",
        "/spec/processing/maxRate",
        "2.5",
        "spec.processing.maxRate",
        "integer",
    ),
    (
        "onPoison is a mode",
        "/spec/processing/onPoison",
        r#""drop""#,
        "spec.processing.onPoison",
        "Unsupported value",
    ),
    (
        "no unknown field",
        "/spec/processing/bogus",
        "1",
        "spec.processing.bogus",
        "bogus",
    ),
    (
        "heartbeat.interval is auto or a duration",
        "/spec/processing/heartbeat",
        r#"{"interval": "sometimes"}"#,
        "spec.processing.heartbeat.interval",
        "\"sometimes\" is not auto or a duration: write a number and a unit (ms, s, m or h), e.g. 30s",
    ),
    (
        "breaker.failurePercent 1..100",
        "/spec/processing/breaker",
        r#"{"failurePercent": 0}"#,
        "spec.processing.breaker",
        "processing.breaker.failurePercent must be between 1 and 100",
    ),
    (
        "breaker.window 2..1000",
        "/spec/processing/breaker",
        r#"{"window": 1}"#,
        "spec.processing.breaker",
        "processing.breaker.window must be between 2 and 1000",
    ),
    (
        "breaker.consecutiveFailures >= 1",
        "/spec/processing/breaker",
        r#"{"consecutiveFailures": 0}"#,
        "spec.processing.breaker",
        "processing.breaker.consecutiveFailures must be between 1 and 1000",
    ),
    (
        "probeBackoff.base <= max",
        "/spec/processing/breaker",
        r#"{"probeBackoff": {"base": "1m", "max": "30s"}}"#,
        "spec.processing.breaker.probeBackoff",
        "probeBackoff.base must not exceed",
    ),
    (
        "probeBackoff.base >= 100ms",
        "/spec/processing/breaker",
        r#"{"probeBackoff": {"base": "10ms"}}"#,
        "spec.processing.breaker.probeBackoff",
        "probeBackoff.base must be at least 100ms",
    ),
    (
        "exactly one handler: none",
        "/spec/handler",
        "{}",
        "spec.handler",
        "handler must set exactly one of http or exec",
    ),
    (
        "exactly one handler: both",
        "/spec/handler",
        r#"{"http": {}, "exec": {"command": ["/h"]}}"#,
        "spec.handler",
        "handler must set exactly one of http or exec",
    ),
    (
        "http.port >= 1",
        "/spec/handler",
        r#"{"http": {"port": 0}}"#,
        "spec.handler.http.port",
        "greater than or equal to 1",
    ),
    (
        "http.port <= 65535",
        "/spec/handler",
        r#"{"http": {"port": 70000}}"#,
        "spec.handler.http.port",
        "less than or equal to 65535",
    ),
    (
        "http.path starts with /",
        "/spec/handler",
        r#"{"http": {"path": "messages"}}"#,
        "spec.handler.http",
        "handler.http.path must start with /",
    ),
    (
        "exec.command not empty",
        "/spec/handler",
        r#"{"exec": {"command": []}}"#,
        "spec.handler.exec.command",
        "at least 1 items",
    ),
    (
        "exec.command names a program",
        "/spec/handler",
        r#"{"exec": {"command": [""]}}"#,
        "spec.handler.exec",
        "handler.exec.command must name a program",
    ),
    (
        "batch.maxItems 1..100",
        "/spec/handler/batch",
        r#"{"maxItems": 0}"#,
        "spec.handler.batch",
        "handler.batch.maxItems must be between 1 and 100",
    ),
    (
        "batch.maxWait <= 5m",
        "/spec/handler/batch",
        r#"{"maxWait": "10m"}"#,
        "spec.handler.batch",
        "handler.batch.maxWait must be at most 5m",
    ),
    (
        "unwrapSns is a mode",
        "/spec/handler/unwrapSns",
        r#""yes""#,
        "spec.handler.unwrapSns",
        "Unsupported value",
    ),
    (
        "redis store needs its Secret",
        "/spec/idempotency",
        r#"{"store": "redis"}"#,
        "spec.idempotency",
        "idempotency.store redis needs idempotency.redis.urlSecretRef",
    ),
    (
        "redis Secret name",
        "/spec/idempotency",
        r#"{"store": "redis", "redis": {"urlSecretRef": {"name": "", "key": "url"}}}"#,
        "spec.idempotency.redis.urlSecretRef.name",
        "at least 1 chars long",
    ),
    (
        "redis Secret key",
        "/spec/idempotency",
        r#"{"store": "redis", "redis": {"urlSecretRef": {"name": "r", "key": ""}}}"#,
        "spec.idempotency.redis.urlSecretRef.key",
        "at least 1 chars long",
    ),
    (
        "idempotency.key form",
        "/spec/idempotency",
        r#"{"key": "jsonPointer:orderId"}"#,
        "spec.idempotency.key",
        "should match",
    ),
    (
        "idempotency.ttl is a duration",
        "/spec/idempotency",
        r#"{"ttl": "a day"}"#,
        "spec.idempotency.ttl",
        "\"a day\" is not a duration: write a number and a unit",
    ),
    (
        "minReplicas <= maxReplicas",
        "/spec/scaling",
        r#"{"minReplicas": 3, "maxReplicas": 2}"#,
        "spec.scaling",
        "scaling.minReplicas must not exceed scaling.maxReplicas",
    ),
    (
        "maxReplicas >= 1",
        "/spec/scaling",
        r#"{"maxReplicas": 0}"#,
        "spec.scaling",
        "scaling.maxReplicas must be at least 1",
    ),
    (
        "maxReplicas is an int32",
        "/spec/scaling",
        r#"{"maxReplicas": 2147483648}"#,
        "spec.scaling",
        "2147483647",
    ),
    (
        "maxBacklogAge > 0s",
        "/spec/scaling",
        r#"{"maxBacklogAge": "0s"}"#,
        "spec.scaling",
        "scaling.maxBacklogAge must be greater than 0s",
    ),
    (
        "pollInterval >= 1s",
        "/spec/scaling",
        r#"{"pollInterval": "500ms"}"#,
        "spec.scaling",
        "scaling.pollInterval must be at least 1s",
    ),
    (
        "alarmActions are SNS topics",
        "/spec/deadLetter",
        r#"{"alarmActions": ["arn:aws:sqs:us-east-1:123456789012:q"]}"#,
        "spec.deadLetter",
        "deadLetter.alarmActions must list SNS topic ARNs",
    ),
    (
        "at most 5 alarmActions",
        "/spec/deadLetter",
        r#"{"alarmActions": ["arn:aws:sns:us-east-1:123456789012:a", "arn:aws:sns:us-east-1:123456789012:b", "arn:aws:sns:us-east-1:123456789012:c", "arn:aws:sns:us-east-1:123456789012:d", "arn:aws:sns:us-east-1:123456789012:e", "arn:aws:sns:us-east-1:123456789012:f"]}"#,
        "spec.deadLetter.alarmActions",
        "must have at most 5 items",
    ),
    (
        "alarmActions need the alarm",
        "/spec/deadLetter",
        r#"{"alarm": false, "alarmActions": ["arn:aws:sns:us-east-1:123456789012:a"]}"#,
        "spec.deadLetter",
        "deadLetter.alarmActions needs deadLetter.alarm: true",
    ),
    (
        "worker resources are quantities",
        "/spec/worker",
        r#"{"resources": {"requests": {"cpu": "lots"}}}"#,
        "spec.worker.resources.requests.cpu",
        "should match",
    ),
    (
        "template.spec lists a container",
        "/spec/template",
        r#"{"spec": {"containers": []}}"#,
        "spec.template.spec",
        "template.spec.containers lists no container: add the handler's container",
    ),
    (
        "template.spec has containers",
        "/spec/template",
        r#"{"spec": {"serviceAccountName": "orders"}}"#,
        "spec.template.spec",
        "template.spec.containers lists no container: add the handler's container",
    ),
    (
        "container names are not the worker's",
        "/spec/template",
        r#"{"spec": {"containers": [{"name": "qc-worker", "image": "shop/orders:1"}]}}"#,
        "spec.template.spec.containers[0]",
        "reserved for the worker",
    ),
    (
        "init container names are not the worker's",
        "/spec/template",
        r#"{"spec": {"containers": [{"name": "app", "image": "shop/orders:1"}], "initContainers": [{"name": "qc-worker-install", "image": "busybox"}]}}"#,
        "spec.template.spec.initContainers[0]",
        "reserved for the worker",
    ),
    (
        "volume names are not the worker's",
        "/spec/template",
        r#"{"spec": {"containers": [{"name": "app", "image": "shop/orders:1"}], "volumes": [{"name": "qc-rate-share", "emptyDir": {}}]}}"#,
        "spec.template.spec.volumes[0]",
        "reserved for the worker",
    ),
    (
        "no user container mounts the worker's binary",
        "/spec/template",
        r#"{"spec": {"containers": [{"name": "app", "image": "shop/orders:1", "volumeMounts": [{"name": "qc-worker-bin", "mountPath": "/x"}]}]}}"#,
        "spec.template.spec.containers[0].volumeMounts[0]",
        "only the worker may mount it",
    ),
    (
        "no user port takes the metrics port's name",
        "/spec/template",
        r#"{"spec": {"containers": [{"name": "app", "image": "shop/orders:1", "ports": [{"name": "qc-metrics", "containerPort": 9100}]}]}}"#,
        "spec.template.spec.containers[0].ports[0]",
        "reserved for the worker's metrics port",
    ),
];

// `check`'s rules the API server cannot apply: none. The pod template stays open in the schema (the
// full PodSpec schema would push the CRD past the size of kubectl's last-applied annotation) except for
// the names the rules above read: containers', init containers', their mounts' and ports', volumes'.
// A rule added to `check` that the server cannot see is named here, with why.

fn valid_spec_document(namespace: &str) -> Value {
    json!({"apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer",
        "metadata": {"name": "rules", "namespace": namespace},
        "spec": {"queue": {"url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"},
                 "processing": {"p99": "2s"}, "handler": {"http": {}},
                 "template": {"spec": {"containers": [{"name": "app", "image": "shop/orders:1"}]}}}})
}

/// `doc` with the value at `pointer` replaced (null: removed), parents created as objects.
fn with(mut doc: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let mut node = &mut doc;
    for part in parent.split('/').skip(1) {
        if node.get(part).is_none() {
            node[part] = json!({});
        }
        node = node.get_mut(part).unwrap();
    }
    let map = node.as_object_mut().unwrap();
    if value.is_null() {
        map.remove(key);
    } else {
        map.insert(key.to_string(), value);
    }
    doc
}

#[tokio::test]
async fn every_spec_rule_of_check_is_the_api_servers_too() {
    let test = "every_spec_rule_of_check_is_the_api_servers_too";
    // `check` side first: it needs no server.
    let mut failures = Vec::new();
    let valid = valid_spec_document("default");
    let text = serde_json::to_string(&valid).unwrap();
    assert!(
        matches!(load_str(&text).unwrap()[0], Document::Valid(_)),
        "the base document is valid"
    );
    for (rule, pointer, value, field, _) in SPEC_RULES {
        let doc = with(valid.clone(), pointer, serde_json::from_str(value).unwrap());
        match &load_str(&serde_json::to_string(&doc).unwrap()).unwrap()[0] {
            Document::Invalid { errors, .. } => {
                // The same field, one inside it, or (for a CEL rule the server reports on its struct)
                // the struct around it; never just `spec`.
                let named = errors.iter().any(|e| {
                    // serde names a missing field by its parent: `spec: missing field `processing``
                    let path = match e.message.strip_prefix("missing field `") {
                        Some(rest) => {
                            format!("{}.{}", e.path, rest.split('`').next().unwrap_or(""))
                        }
                        None => e.path.clone(),
                    };
                    let path = path.trim_start_matches('.');
                    let within = |outer: &str, inner: &str| {
                        inner == outer
                            || inner.starts_with(&format!("{outer}."))
                            || inner.starts_with(&format!("{outer}["))
                    };
                    within(field, path) || (path != "spec" && within(path, field))
                });
                if !named {
                    failures.push(format!("check, {rule}: names {errors:?}, not {field}"));
                }
            }
            other => failures.push(format!("check accepts {rule}: {other:?}")),
        }
    }
    let Some(real) = k8s::connect(test).await else {
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        return;
    };
    let api = real.queue_consumers();
    let valid = valid_spec_document(&real.namespace);
    k8s::kubectl_dry_apply(&api, "rules", &valid)
        .await
        .expect("the base document is valid");
    for (rule, pointer, value, field, says) in SPEC_RULES {
        let doc = with(valid.clone(), pointer, serde_json::from_str(value).unwrap());
        match k8s::kubectl_dry_apply(&api, "rules", &doc).await {
            Ok(_) => failures.push(format!("the server accepts {rule} ({pointer}: {value})")),
            Err(kube::Error::Api(status)) => {
                let fields: Vec<&str> = status
                    .details
                    .iter()
                    .flat_map(|d| d.causes.iter())
                    .map(|c| c.field.as_str())
                    .collect();
                let names_field = fields.contains(field) || status.message.contains(field);
                if !names_field || !status.message.contains(says) {
                    failures.push(format!(
                        "{rule}: the server's refusal should name {field} and say {says:?}: fields {fields:?}, {}",
                        status.message
                    ));
                }
            }
            Err(e) => panic!("{rule}: {e}"),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
