//! `qc-operator import keda` as a user runs it: the real binary on ScaledObjects shaped as KEDA's
//! aws-sqs-queue documentation shows them (tests/data/keda/), every printed QueueConsumer parsed back
//! through the crate's own loader, the notes on stderr, and exit 2 with nothing printed on bad input.

use std::io::Write as _;
use std::process::{Command, Stdio};

use qc::api::{Mode, QueueConsumer};
use qc::manifest::{self, Document};
use serde_json::{Value, json};

const DIR: &str = "tests/data/keda";

fn qc_operator(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qc-operator runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("write stdin");
    drop(input);
    let out = child.wait_with_output().expect("qc-operator exits");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn import(args: &[&str]) -> (i32, String, String) {
    let mut all = vec!["import", "keda"];
    all.extend_from_slice(args);
    qc_operator(&all, None)
}

fn fixture(name: &str) -> String {
    format!("{DIR}/{name}.yaml")
}

/// Every document of stdout: a QueueConsumer that passes the CRD's schema and rules and whose mode is
/// consistent, with its data as a JSON value (what the exact comparisons read).
fn consumers(stdout: &str) -> Vec<(QueueConsumer, Value)> {
    let docs = manifest::load_str(stdout).expect("stdout is YAML");
    let values: Vec<Value> = serde_saphyr::from_multiple(stdout).expect("stdout is YAML");
    let values: Vec<Value> = values.into_iter().filter(|v| !v.is_null()).collect();
    assert_eq!(docs.len(), values.len());
    docs.into_iter()
        .zip(values)
        .map(|(doc, value)| match doc {
            Document::Valid(qc) => {
                assert_eq!(qc.spec.mode_conflict(), None, "{stdout}");
                (*qc, value)
            }
            other => panic!("not a valid QueueConsumer: {other:?}\n{stdout}"),
        })
        .collect()
}

fn lines(stderr: &str) -> Vec<&str> {
    stderr.lines().collect()
}

#[test]
fn pod_identity_aws_becomes_a_scale_only_consumer_with_the_role() {
    let file = fixture("pod_identity_aws");
    let (code, out, err) = import(&[&file]);
    assert_eq!(code, 0, "{err}");
    let [(qc, value)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert_eq!(
        value,
        json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1",
            "kind": "QueueConsumer",
            "metadata": {"name": "aws-sqs-queue-scaledobject", "namespace": "keda-test"},
            "spec": {
                "queue": {
                    "url": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                    "region": "eu-west-1"
                },
                "aws": {"roleArn": "arn:aws:iam::123456789012:role/keda-sqs-reader"},
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "nginx-deployment"},
                "processing": {"p99": "30s", "concurrency": 5},
                "scaling": {
                    "minReplicas": 0,
                    "maxReplicas": 20,
                    "maxBacklogAge": "30s",
                    "pollInterval": "15s",
                    "activationBacklog": 2
                }
            }
        })
    );
    assert!(
        matches!(qc.spec.mode(), Mode::ScaleOnly(t) if t.describe() == "Deployment/nginx-deployment")
    );
    let at = format!("{file}, document 2: ScaledObject keda-test/aws-sqs-queue-scaledobject");
    assert_eq!(
        lines(&err),
        [
            format!(
                "note: {at}: spec.cooldownPeriod: 300 (seconds): not mapped: KEDA waited this long after the last active poll before scaling to zero; a QueueConsumer holds every scale-down, to zero too, for scaling.scaleDownStabilization (default auto: about one measured pod start-up); to wait as KEDA did, set scaling.scaleDownStabilization: 5m"
            ),
            format!(
                "note: {at}: spec.triggers[0].metadata.queueLength: 5: does not map 1:1: KEDA kept 5 messages (visible + in flight) per replica; a QueueConsumer sizes replicas from processing.p99 (time per message) and processing.concurrency (messages one replica handles at once), draining the visible backlog within scaling.maxBacklogAge: concurrency 5 (from queueLength: set what your consumer handles at once), p99 30s is a placeholder (with maxBacklogAge 30s: KEDA's count) until you declare your consumer's P99"
            ),
            format!(
                "todo: {at}: QueueConsumer aws-sqs-queue-scaledobject: spec.processing.p99: placeholder 30s: declare your consumer's P99 time to handle one message (or import with --p99 DURATION)"
            ),
            "warning: QueueConsumer keda-test/aws-sqs-queue-scaledobject (from ScaledObject keda-test/aws-sqs-queue-scaledobject) cannot be applied as it is: fill in spec.processing.p99 (the todo lines above; TODO(import) in its YAML)".to_string(),
            "imported 1 QueueConsumer(s) from 1 ScaledObject(s)".to_string(),
        ]
    );
    // the YAML says what to do where the user reads it
    assert!(
        out.contains("    # TODO(import): p99 is a placeholder"),
        "{out}"
    );
    assert!(
        out.contains("# NOT READY TO APPLY: fill in spec.processing.p99"),
        "{out}"
    );
    assert!(out.contains("ExternalId qc:keda-test"), "{out}");
    assert!(
        out.contains("    maxReplicas: 20  # maxReplicaCount\n"),
        "{out}"
    );
}

#[test]
fn a_declared_p99_and_concurrency_make_a_consumer_ready_to_apply() {
    let (code, out, err) = import(&[
        &fixture("pod_identity_aws"),
        "--p99",
        "1.5s",
        "--concurrency",
        "8",
    ]);
    assert_eq!(code, 0, "{err}");
    let [(_, value)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert_eq!(
        value["spec"]["processing"],
        json!({"p99": "1s500ms", "concurrency": 8})
    );
    assert_eq!(value["spec"]["scaling"].get("maxBacklogAge"), None);
    assert!(!out.contains("TODO"), "{out}");
    assert!(!err.contains("todo:") && !err.contains("warning:"), "{err}");
}

#[test]
fn a_role_arn_in_a_secret_is_left_to_fill_in_with_where_it_is() {
    let file = fixture("aws_role_arn");
    let (code, out, err) = import(&[&file, "--p99", "2s"]);
    assert_eq!(code, 0, "{err}");
    let [(qc, value)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert!(qc.spec.aws.role_arn.is_none());
    assert_eq!(value["spec"].get("aws"), None);
    assert_eq!(
        value["spec"]["scaling"],
        json!({"maxReplicas": 100}),
        "KEDA's default maxReplicaCount, not the QueueConsumer's 20"
    );
    let at = format!("{file}, document 3: ScaledObject keda-test/aws-sqs-queue-scaledobject");
    let err_lines = lines(&err);
    assert!(
        err_lines.contains(&format!(
            "todo: {at}: TriggerAuthentication keda-test/keda-trigger-auth-aws-role spec.secretTargetRef[0] (awsRoleArn): not mapped: the role ARN KEDA assumed is in Secret test-secrets, key AWS_ROLE_ARN, which this import does not read: set spec.aws.roleArn to it (and let the qc-operator's role assume it, with ExternalId qc:keda-test)"
        ).as_str()),
        "{err}"
    );
    assert!(
        err_lines.contains(&"warning: QueueConsumer keda-test/aws-sqs-queue-scaledobject (from ScaledObject keda-test/aws-sqs-queue-scaledobject) cannot be applied as it is: fill in spec.aws.roleArn (the todo lines above; TODO(import) in its YAML)"),
        "{err}"
    );
    assert!(
        err_lines.contains(
            &"imported 1 QueueConsumer(s) from 1 ScaledObject(s); 1 document(s) of other kinds not read"
        ),
        "{err}"
    );
    assert!(
        out.contains("  # TODO(import): aws.roleArn: KEDA used the role ARN in Secret test-secrets, key AWS_ROLE_ARN,"),
        "{out}"
    );
    assert!(
        out.contains("  #   aws: {roleArn: arn:aws:iam::ACCOUNT_ID:role/NAME}\n"),
        "{out}"
    );
}

#[test]
fn static_credentials_are_not_carried_over_and_each_key_says_to_use_a_role() {
    let file = fixture("static_credentials");
    let (code, out, err) = import(&[&file, "--p99", "2s"]);
    assert_eq!(code, 0, "{err}");
    let [(_, value)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert_eq!(value["spec"].get("aws"), None);
    assert_eq!(
        value["spec"]["scaling"],
        json!({"maxReplicas": 100, "scaleOnInFlight": false})
    );
    let at = format!("{file}, document 3: ScaledObject keda-test/aws-sqs-queue-scaledobject");
    for (i, parameter) in ["awsAccessKeyID", "awsSecretAccessKey", "awsSessionToken"]
        .iter()
        .enumerate()
    {
        let line = format!(
            "note: {at}: TriggerAuthentication keda-test/keda-trigger-auth-aws-credentials spec.secretTargetRef[{i}] ({parameter}): not mapped: static AWS keys are not used by a QueueConsumer: the controller reads the queue with its own identity, or assumes spec.aws.roleArn; give the keys' permissions to an IAM role (IRSA or EKS Pod Identity) and name it in spec.aws.roleArn"
        );
        assert!(
            lines(&err).contains(&line.as_str()),
            "{line}\nnot in\n{err}"
        );
    }
    // nothing to fill in: the controller's own identity reads the queue
    assert!(!err.contains("warning:"), "{err}");
}

#[test]
fn queue_url_from_env_cannot_be_imported_and_says_where_the_value_is() {
    let file = fixture("queue_url_from_env");
    let (code, out, err) = import(&[&file]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "");
    assert!(
        lines(&err).contains(&format!(
            "error: {file}, document 2: ScaledObject keda-test/aws-sqs-queue-scaledobject: spec.triggers[0].metadata.queueURLFromEnv: \"QUEUE_URL\" names an environment variable of the scaled workload's container, which this import does not read (it reads the files given, not the cluster), and a QueueConsumer holds the queue URL itself: add queueURL with that variable's value to the trigger (kubectl get deployment nginx-deployment -n keda-test -o yaml shows it) and import again"
        ).as_str()),
        "{err}"
    );
    assert!(
        err.contains("spec.scaleTargetRef.envSourceContainerName: \"consumer\": not needed"),
        "{err}"
    );
    assert!(
        err.ends_with("nothing printed: fix the input above and import again\n"),
        "{err}"
    );
}

#[test]
fn a_paused_scaled_object_becomes_a_suspended_consumer_and_says_how_that_differs() {
    let file = fixture("paused");
    let (code, out, err) = import(&[&file, "--p99", "2s"]);
    assert_eq!(code, 0, "{err}");
    let [(qc, value)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert!(qc.spec.suspend);
    assert_eq!(
        value["spec"],
        json!({
            "queue": {
                "url": "https://sqs.us-east-1.amazonaws.com/123456789012/billing.fifo",
                "region": "us-east-1"
            },
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "billing-consumer"},
            "processing": {"p99": "2s", "concurrency": 10},
            "scaling": {"minReplicas": 1, "maxReplicas": 8, "scaleDownStabilization": "2m"},
            "suspend": true
        })
    );
    let at = format!("{file}, document 1: ScaledObject shop/billing");
    for line in [
        format!(
            "note: {at}: metadata.annotations[autoscaling.keda.sh/paused]: \"true\": mapped to spec.suspend: true, which scales the target to zero and pauses the scaler, where KEDA's pause kept the replicas it had; remove spec.suspend to keep the workload running"
        ),
        format!(
            "note: {at}: spec.fallback: not mapped: KEDA moved to 4 replicas after failed reads of the queue; when the queue cannot be read the controller holds the replicas where they are (ScalingActive=False, MetricsUnavailable) and says why in QueueReachable"
        ),
    ] {
        assert!(
            lines(&err).contains(&line.as_str()),
            "{line}\nnot in\n{err}"
        );
    }
}

#[test]
fn several_queues_are_refused_in_scale_only_mode_and_become_one_worker_each_with_worker() {
    let file = fixture("several_triggers");
    let (code, out, err) = import(&[&file]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "");
    assert!(
        lines(&err).contains(&format!(
            "error: {file}, document 2: ScaledObject shop/orders: spec.triggers: 2 aws-sqs-queue triggers (triggers[0], triggers[1]): in scale-only mode a QueueConsumer scales its target from one queue, and one QueueConsumer per queue would have two scalers set the replicas of Deployment/orders; keep one trigger, give each queue a workload (and ScaledObject) of its own, or import with --with-worker (one bundled worker per queue)"
        ).as_str()),
        "{err}"
    );

    let (code, out, err) = import(&[&file, "--with-worker", "--p99", "500ms"]);
    assert_eq!(code, 0, "{err}");
    let consumers = consumers(&out);
    let values: Vec<&Value> = consumers.iter().map(|(_, v)| v).collect();
    let expected = |name: &str, queue: &str, concurrency: u32| {
        json!({
            "apiVersion": "sqs.consumers.dev/v1alpha1",
            "kind": "QueueConsumer",
            "metadata": {"name": name, "namespace": "shop"},
            "spec": {
                "queue": {
                    "url": format!("https://sqs.eu-west-1.amazonaws.com/123456789012/{queue}"),
                    "region": "eu-west-1"
                },
                "aws": {"roleArn": "arn:aws:iam::123456789012:role/keda-sqs-reader"},
                "processing": {"p99": "500ms", "concurrency": concurrency},
                "handler": {"http": {"port": 8080, "path": "/messages"}},
                "scaling": {"maxReplicas": 30}
            }
        })
    };
    assert_eq!(
        values,
        [
            &expected("orders-high", "orders-high", 2),
            &expected("orders-low", "orders-low", 20)
        ]
    );
    for (qc, _) in &consumers {
        assert_eq!(qc.spec.mode(), Mode::Worker);
        // the template is the user's to write: the controller would hold it (NoHandlerContainer)
        assert!(qc.spec.template.spec.is_none());
    }
    let at = format!("{file}, document 2: ScaledObject shop/orders");
    assert!(
        lines(&err).contains(&format!(
            "note: {at}: spec.triggers[2] (type cpu): not mapped: a QueueConsumer scales from its queue alone, where KEDA took the highest of its triggers' replica counts; if this trigger matters (e.g. cpu), keep scaling the workload on it some other way"
        ).as_str()),
        "{err}"
    );
    for name in ["orders-high", "orders-low"] {
        let line = format!(
            "warning: QueueConsumer shop/{name} (from ScaledObject shop/orders) cannot be applied as it is: fill in spec.handler, spec.template (the todo lines above; TODO(import) in its YAML)"
        );
        assert!(
            lines(&err).contains(&line.as_str()),
            "{line}\nnot in\n{err}"
        );
    }
    assert!(
        out.contains(
            "  #   kubectl get deployment orders -n shop -o jsonpath='{.spec.template}'\n"
        ),
        "{out}"
    );
}

#[test]
fn stdin_takes_what_kubectl_get_prints() {
    let list = r#"
apiVersion: v1
kind: List
items:
- apiVersion: keda.sh/v1alpha1
  kind: ScaledObject
  metadata:
    name: orders
    namespace: shop
    uid: 0b6f0c4e-1111-2222-3333-444455556666
    resourceVersion: "4242"
    annotations:
      kubectl.kubernetes.io/last-applied-configuration: "{}"
  spec:
    scaleTargetRef: {name: orders}
    triggers:
    - type: aws-sqs-queue
      metadata: {queueURL: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders", queueLength: "7"}
  status:
    hpaName: keda-hpa-orders
    conditions: [{type: Ready, status: "True"}]
"#;
    let (code, out, err) = qc_operator(&["import", "keda", "-", "--p99", "2s"], Some(list));
    assert_eq!(code, 0, "{err}");
    let [(qc, _)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert_eq!(qc.spec.processing.concurrency, 7);
    assert!(
        out.contains("from ScaledObject shop/orders ((stdin), document 1, items[0])"),
        "{out}"
    );
    assert!(
        !err.contains("last-applied") && !err.contains("status"),
        "{err}"
    );
}

#[test]
fn bad_input_exits_2_naming_file_document_field_and_fix_and_prints_nothing() {
    let cases = [
        (
            fixture("not_yaml"),
            format!(
                "error: {}: not valid YAML (give KEDA objects as YAML",
                fixture("not_yaml")
            ),
        ),
        (
            fixture("missing_target_name"),
            format!(
                "error: {}, document 1: ScaledObject shop/orders: spec.scaleTargetRef.name: required: the name of the workload KEDA scales (a Deployment unless kind says otherwise); add it, e.g. name: orders",
                fixture("missing_target_name")
            ),
        ),
        (
            fixture("missing_queue_url"),
            format!(
                "error: {}, document 1: ScaledObject shop/orders: spec.triggers[0].metadata.queueURL: required: the queue's URL, e.g. queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                fixture("missing_queue_url")
            ),
        ),
        (
            fixture("missing_auth"),
            format!(
                "error: {}, document 1: ScaledObject shop/orders: spec.triggers[0].authenticationRef.name: TriggerAuthentication \"keda-trigger-auth-aws-credentials\" is not in the files given: add the file that holds it (`kubectl get triggerauthentication keda-trigger-auth-aws-credentials -n shop -o yaml > keda-trigger-auth-aws-credentials.yaml`) and import again",
                fixture("missing_auth")
            ),
        ),
        (
            fixture("no_sqs_trigger"),
            format!(
                "error: {}: no ScaledObject with an aws-sqs-queue trigger: nothing to import (the notes say why each was skipped)",
                fixture("no_sqs_trigger")
            ),
        ),
        (
            fixture("no_such_file"),
            format!(
                "error: {}: cannot read it: No such file or directory (os error 2): give the path of a file of KEDA objects, or - for stdin",
                fixture("no_such_file")
            ),
        ),
    ];
    for (file, want) in cases {
        let (code, out, err) = import(&[&file]);
        assert_eq!(code, 2, "{file}: {err}");
        assert_eq!(out, "", "{file}");
        assert!(
            err.lines().any(|l| l.starts_with(&want)),
            "{file}: {want:?} not in\n{err}"
        );
    }
    // the skipped ScaledObject says why on its own line
    let (_, _, err) = import(&[&fixture("no_sqs_trigger")]);
    assert!(
        err.contains(&format!(
            "note: {}, document 1: ScaledObject shop/web: spec.triggers: skipped: no aws-sqs-queue trigger (types: cpu); a QueueConsumer scales from an SQS queue",
            fixture("no_sqs_trigger")
        )),
        "{err}"
    );
}

#[test]
fn one_bad_file_among_good_ones_prints_no_consumer_at_all() {
    let (code, out, err) = import(&[&fixture("pod_identity_aws"), &fixture("missing_queue_url")]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(
        out, "",
        "a partial set would be applied as if it were whole"
    );
    assert!(
        err.contains("spec.triggers[0].metadata.queueURL: required"),
        "{err}"
    );
}

#[test]
fn the_trigger_authentication_may_come_in_another_file_of_the_same_namespace() {
    let (code, out, err) = import(&[
        &fixture("missing_auth"),
        &fixture("trigger_auth_shop"),
        "--p99",
        "2s",
    ]);
    assert_eq!(code, 0, "{err}");
    let [(qc, _)] = consumers(&out).try_into().expect("one QueueConsumer");
    assert_eq!(
        qc.spec.aws.role_arn.as_deref(),
        Some("arn:aws:iam::123456789012:role/shop-sqs-reader")
    );
    // one of that name in another namespace is not the one KEDA would use
    let (code, out, err) = import(&[&fixture("missing_auth"), &fixture("pod_identity_aws")]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(out, "");
    assert!(
        err.contains(
            "TriggerAuthentication \"keda-trigger-auth-aws-credentials\" is not in the files given"
        ),
        "{err}"
    );
}

/// The fenced block after `<!-- MARKER -->` in docs/migrate-from-keda.md.
fn doc_block(doc: &str, marker: &str) -> String {
    let start = doc
        .find(&format!("<!-- {marker}"))
        .unwrap_or_else(|| panic!("{marker} in the guide"));
    let fence = start + doc[start..].find("```").expect("a fence");
    let body = fence + doc[fence..].find('\n').expect("fence line") + 1;
    let end = body + doc[body..].find("```").expect("closing fence");
    doc[body..end].to_string()
}

#[test]
fn the_guides_example_is_what_the_command_prints() {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/migrate-from-keda.md"),
    )
    .expect("docs/migrate-from-keda.md");
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("keda.yaml"),
        doc_block(&doc, "import-example-input: keda.yaml"),
    )
    .expect("write keda.yaml");
    let out = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(["import", "keda", "keda.yaml", "--p99", "2s"])
        .current_dir(dir.path())
        .output()
        .expect("qc-operator runs");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        doc_block(&doc, "import-example-stdout")
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        doc_block(&doc, "import-example-stderr")
    );
    consumers(&doc_block(&doc, "import-example-stdout"));
}
