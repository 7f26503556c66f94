//! Bad QueueConsumer documents are rejected with the field named, never a panic; the real Kubernetes
//! API server (the CRD's schema and CEL rules) rejects each of them for the same field.

mod common;

use common::k8s;
use qc::manifest::{Document, load_str};
use serde_json::{Value, json};

const BASE: &str = "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: x}\nspec:\n  queue: {url: https://sqs.us-east-1.amazonaws.com/1/q}\n";

fn errors(extra: &str) -> Vec<String> {
    let docs = load_str(&format!("{BASE}{extra}")).expect("yaml parses");
    assert_eq!(docs.len(), 1);
    match &docs[0] {
        Document::Invalid { errors, .. } => errors
            .iter()
            .map(std::string::ToString::to_string)
            .collect(),
        other => panic!("expected invalid, got {other:?}"),
    }
}

/// Bad fields: what follows `spec:` after the queue, and what `check` must say about it.
/// `the_real_api_server_rejects_the_same_field` below sends each to the real API server too.
const BAD_FIELDS: &[(&str, &str)] = &[
    (
        "  handler: {http: {}}\n  processing: {p99: 2x}\n",
        "spec.processing.p99: invalid duration",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 2s, bogus: 1}\n",
        "spec.processing.bogus: unknown field `bogus`",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 40s}\n",
        "spec.processing: processing.p99 must not exceed processing.timeout",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, batchSize: 11}\n",
        "processing.batchSize must be between 1 and 10",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, batchSize: 0}\n",
        "processing.batchSize must be between 1 and 10",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, waitTime: 21s}\n",
        "processing.waitTime must be at most 20s",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, concurrency: 0}\n",
        "processing.concurrency must be at least 1",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, maxRate: 0}\n",
        "processing.maxRate must be a whole number of messages per second from 1 to 1000000",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, maxRate: 2.5}\n",
        "spec.processing.maxRate: invalid type: floating point `2.5`",
    ),
    (
        "  handler: {}\n  processing: {p99: 1s}\n",
        "spec.handler: handler must set exactly one of http or exec",
    ),
    (
        "  handler: {http: {}, exec: {command: [a]}}\n  processing: {p99: 1s}\n",
        "exactly one of http or exec",
    ),
    (
        "  handler: {exec: {command: []}}\n  processing: {p99: 1s}\n",
        "spec.handler.exec.command: must name a program",
    ),
    (
        "  handler: {http: {path: messages}}\n  processing: {p99: 1s}\n",
        "spec.handler.http.path: must start with /",
    ),
    (
        "  handler: {http: {port: 70000}}\n  processing: {p99: 1s}\n",
        "spec.handler.http.port",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s}\n  scaling: {minReplicas: 3, maxReplicas: 2}\n",
        "scaling.minReplicas must not exceed scaling.maxReplicas",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s}\n  idempotency: {store: redis}\n",
        "idempotency.store redis needs idempotency.redis.urlSecretRef",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s}\n  idempotency: {key: jsonPointer:orderId}\n",
        "spec.idempotency.key: invalid idempotency key",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, heartbeat: {interval: sometimes}}\n",
        "spec.processing.heartbeat.interval: invalid duration",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s, onPoison: drop}\n",
        "spec.processing.onPoison: unknown variant `drop`",
    ),
    (
        "  handler: {http: {}}\n",
        "spec: missing field `processing`",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 5s}\n  scaling: {objective: {dwellP99: 5s}}\n",
        "spec.scaling.objective.dwellP99 must be greater than processing.p99",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s}\n  scaling: {objective: {dwellP99: 0s}}\n",
        "scaling.objective.dwellP99 must be greater than 0s",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s}\n  scaling: {objective: {dwellP99: soon}}\n",
        "spec.scaling.objective.dwellP99: invalid duration",
    ),
    (
        "  handler: {http: {}}\n  processing: {p99: 1s}\n  scaling: {objective: {}}\n",
        "missing field `dwellP99`",
    ),
    (
        "  scaleTargetRef: {name: orders}\n  processing: {p99: 1s}\n  scaling: {objective: {dwellP99: 1m}}\n",
        "spec.scaling.objective needs the bundled qc-worker",
    ),
];

#[test]
fn each_bad_field_is_named() {
    for (extra, expected) in BAD_FIELDS {
        let got = errors(extra);
        assert!(
            got.iter().any(|e| e.contains(expected)),
            "for {extra:?} expected {expected:?}, got {got:?}"
        );
    }
}

#[test]
fn wrong_version_and_missing_name() {
    let docs = load_str(
        "apiVersion: sqs.consumers.dev/v1\nkind: QueueConsumer\nmetadata: {name: x}\nspec: {}\n",
    )
    .expect("yaml");
    match &docs[0] {
        Document::Invalid { errors, .. } => assert!(errors[0].to_string().contains("apiVersion: unsupported version \"sqs.consumers.dev/v1\": use sqs.consumers.dev/v1alpha1")),
        other => panic!("{other:?}"),
    }
    let docs = load_str(
        &BASE
            .replace("metadata: {name: x}", "metadata: {}")
            .clone()
            .replace(
                "spec:\n",
                "spec:\n  handler: {http: {}}\n  processing: {p99: 1s}\n",
            ),
    )
    .expect("yaml");
    match &docs[0] {
        Document::Invalid { errors, .. } => assert!(
            errors.iter().any(|e| e.path == "metadata.name"),
            "{errors:?}"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn defaults_are_applied() {
    let docs = load_str(&format!(
        "{BASE}  handler: {{http: {{}}}}\n  processing: {{p99: 1s}}\n"
    ))
    .expect("yaml");
    let Document::Valid(qc) = &docs[0] else {
        panic!("{:?}", docs[0])
    };
    let p = &qc.spec.processing;
    assert_eq!(
        (
            p.concurrency,
            p.batch_size,
            p.wait_time.to_string(),
            p.timeout.to_string()
        ),
        (10, 10, "20s".into(), "30s".into())
    );
    assert_eq!(qc.spec.scaling.max_replicas, 20);
    assert_eq!(
        qc.spec
            .handler
            .http
            .as_ref()
            .map(|h| (h.port, h.path.as_str())),
        Some((8080, "/messages"))
    );
    assert!(qc.spec.dead_letter.alarm);
    assert_eq!(qc.spec.idempotency.ttl.to_string(), "24h");
}

#[test]
fn garbage_never_panics() {
    for text in [
        "",
        "---\n---\n",
        "42",
        "[1, 2]",
        "kind: QueueConsumer\n",
        "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nspec: 3\n",
        "\u{0}\u{1}",
    ] {
        let _ = load_str(text);
    }
}

/// The fields `check` names for a document (a missing field counts as the field itself).
fn check_fields(text: &str) -> Vec<String> {
    let docs = load_str(text).expect("yaml parses");
    let Some(Document::Invalid { errors, .. }) =
        docs.iter().find(|d| !matches!(d, Document::Other { .. }))
    else {
        panic!("`check` accepts {text}")
    };
    errors
        .iter()
        .map(|e| match e.message.strip_prefix("missing field `") {
            Some(rest) => format!("{}.{}", e.path, rest.split('`').next().unwrap_or("")),
            None => e.path.clone(),
        })
        .collect()
}

/// The fields the API server names when it refuses an object: the causes of a 422, or the field of
/// a strict-decoding error (an unknown field).
fn server_fields(status: &kube::core::Status) -> Vec<String> {
    let mut out: Vec<String> = status
        .details
        .iter()
        .flat_map(|d| d.causes.iter())
        .map(|c| c.field.clone())
        .collect();
    // create/update with fieldValidation=Strict: `unknown field "spec.x"`
    for part in status.message.split("unknown field \"").skip(1) {
        out.push(part.split('"').next().unwrap_or("").to_string());
    }
    // server-side apply: `failed to create typed patch object (...): .spec.x: field not declared in schema`
    if let Some((head, _)) = status.message.split_once(": field not declared in schema") {
        let field = head.rsplit(' ').next().unwrap_or("");
        out.push(field.trim_start_matches('.').to_string());
    }
    out
}

#[tokio::test]
async fn the_real_api_server_rejects_the_same_field() {
    let test = "the_real_api_server_rejects_the_same_field";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let api = real.queue_consumers();
    let mut cases: Vec<(String, String)> = BAD_FIELDS
        .iter()
        .map(|(extra, _)| ((*extra).to_string(), format!("{BASE}{extra}")))
        .collect();
    cases.push((
        "tests/data/invalid.yaml".into(),
        std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/invalid.yaml"
        ))
        .unwrap(),
    ));
    let mut failures = Vec::new();
    for (label, text) in &cases {
        let check = check_fields(text);
        let docs: Vec<Value> = serde_saphyr::from_multiple(text).unwrap();
        let mut doc = docs
            .into_iter()
            .find(|d| d["kind"] == "QueueConsumer")
            .unwrap();
        doc["metadata"]["namespace"] = json!(real.namespace);
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        match k8s::kubectl_dry_apply(&api, &name, &doc).await {
            Ok(_) => failures.push(format!(
                "{label:?}: the server accepts it; `check` names {check:?}"
            )),
            Err(kube::Error::Api(status)) => {
                let server = server_fields(&status);
                if !check.iter().any(|c| server.contains(c)) {
                    failures.push(format!(
                        "{label:?}: `check` names {check:?}, the server {server:?} ({})",
                        status.message
                    ));
                }
            }
            Err(e) => panic!("{label:?}: {e}"),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
