//! Bad input on the manifest side, one named row each: QueueConsumer manifests (through the loader that
//! `check` and `plan` use: schema, the CRD's CEL rules, render), the controller's endpoint policy, the
//! `qc-operator` command line and the chart's values. Every row expects a clear error naming the field
//! and the fix, or a safe outcome; none may panic, and a rejected manifest yields nothing to apply.
//! The worker's rows (SQS answers, handler answers, env and flags) are in tests/bad_input_worker.rs.
//! The controller's own behaviour on such input (no request to a refused endpoint, a silent endpoint,
//! status naming another alarm) is tested against moto in tests/controller_safety.rs.

#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::process::Command;

use qc::aws::endpoints::AllowedEndpoints;
use qc::manifest::{Document, load_str};
use serde_json::{Value, json};

use common::fixture::consumer;

/// A valid QueueConsumer each row breaks in one place.
fn base() -> Value {
    consumer("orders")
        .namespace("shop")
        .p99("2s")
        .image("shop/orders:1")
        .json()
}

/// Sets `pointer` (created as objects on the way) to `value`.
fn set(doc: &mut Value, pointer: &str, value: Value) {
    let mut at = doc;
    let parts: Vec<String> = pointer
        .split('/')
        .skip(1)
        .map(|p| p.replace("~1", "/").replace("~0", "~"))
        .collect();
    for (i, p) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            at[p.as_str()] = value;
            return;
        }
        if at.get(p.as_str()).is_none() {
            at[p.as_str()] = json!({});
        }
        at = &mut at[p.as_str()];
    }
}

/// The loader's verdict on a document: Ok, or every error as text.
fn load(text: &str) -> Result<(), Vec<String>> {
    let docs = load_str(text).map_err(|e| vec![e])?;
    let mut errors = Vec::new();
    for d in docs {
        if let Document::Invalid { errors: e, .. } = d {
            errors.extend(e.iter().map(ToString::to_string));
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors)
    }
}

type Edits = Vec<(&'static str, Value)>;

struct Row {
    name: &'static str,
    /// JSON pointer and value set on the base manifest.
    edits: Vec<(&'static str, Value)>,
    /// Every one of these appears in one error: the field and the fix.
    expect: &'static [&'static str],
}

fn row(
    name: &'static str,
    edits: Vec<(&'static str, Value)>,
    expect: &'static [&'static str],
) -> Row {
    Row {
        name,
        edits,
        expect,
    }
}

fn manifest_rows() -> Vec<Row> {
    vec![
        row(
            "concurrency_u32_max",
            vec![("/spec/processing/concurrency", json!(4_294_967_295u64))],
            &[
                "processing.concurrency must be at most 10000",
                "add replicas",
            ],
        ),
        row(
            "concurrency_one_above_the_worker_limit",
            vec![("/spec/processing/concurrency", json!(10_001))],
            &["processing.concurrency must be at most 10000"],
        ),
        row(
            "concurrency_beyond_u32",
            vec![("/spec/processing/concurrency", json!(4_294_967_296u64))],
            &["spec.processing.concurrency", "invalid value"],
        ),
        row(
            "concurrency_negative",
            vec![("/spec/processing/concurrency", json!(-1))],
            &["spec.processing.concurrency"],
        ),
        row(
            "concurrency_fraction",
            vec![("/spec/processing/concurrency", json!(1.5))],
            &["spec.processing.concurrency"],
        ),
        row(
            "concurrency_zero",
            vec![("/spec/processing/concurrency", json!(0))],
            &["processing.concurrency must be at least 1"],
        ),
        row(
            "region_with_crlf",
            vec![(
                "/spec/queue/region",
                json!("us-east-1\r\nX-Amz-Target: AmazonSQS.DeleteQueue"),
            )],
            &["queue.region must be an AWS region"],
        ),
        row(
            "region_uppercase",
            vec![("/spec/queue/region", json!("US-EAST-1"))],
            &["queue.region must be an AWS region such as us-east-1"],
        ),
        row(
            "url_path_with_crlf",
            vec![(
                "/spec/queue/url",
                json!(
                    "https://sqs.us-east-1.amazonaws.com/123456789012/orders\r\nHost: evil.example"
                ),
            )],
            &[
                "queue.url must be an http(s) URL",
                "without spaces, CR or LF",
            ],
        ),
        row(
            "url_with_space",
            vec![(
                "/spec/queue/url",
                json!("https://sqs.us-east-1.amazonaws.com/123456789012/my orders"),
            )],
            &["queue.url must be an http(s) URL"],
        ),
        row(
            "url_file_scheme",
            vec![("/spec/queue/url", json!("file:///etc/passwd"))],
            &[
                "spec.queue.url",
                "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
            ],
        ),
        row(
            "url_empty",
            vec![("/spec/queue/url", json!(""))],
            &["spec.queue.url", "required"],
        ),
        row(
            "endpoint_with_crlf",
            vec![(
                "/spec/queue/endpoint",
                json!("http://localhost:4566\r\nX: y"),
            )],
            &["queue.endpoint must be an http(s) URL"],
        ),
        row(
            "endpoint_ftp",
            vec![("/spec/queue/endpoint", json!("ftp://files.example"))],
            &[
                "queue.endpoint must be an http(s) URL",
                "leave it out on AWS",
            ],
        ),
        row(
            "role_arn_a_user",
            vec![(
                "/spec/aws/roleArn",
                json!("arn:aws:iam::123456789012:user/alice"),
            )],
            &[
                "aws.roleArn must be an IAM role ARN",
                "role/orders-consumer",
            ],
        ),
        row(
            "role_arn_with_crlf",
            vec![(
                "/spec/aws/roleArn",
                json!("arn:aws:iam::123456789012:role/a\r\nX: y"),
            )],
            &["aws.roleArn must be an IAM role ARN"],
        ),
        row(
            "aws_unknown_field",
            vec![("/spec/aws/role", json!("arn:aws:iam::123456789012:role/a"))],
            &["spec.aws", "unknown field `role`"],
        ),
        row(
            "alarm_actions_not_sns",
            vec![(
                "/spec/deadLetter/alarmActions",
                json!(["arn:aws:sqs:us-east-1:123456789012:alerts"]),
            )],
            &[
                "deadLetter.alarmActions must list SNS topic ARNs",
                "arn:aws:sns:",
            ],
        ),
        row(
            "alarm_actions_six",
            vec![(
                "/spec/deadLetter/alarmActions",
                json!(
                    (0..6)
                        .map(|i| format!("arn:aws:sns:us-east-1:123456789012:t{i}"))
                        .collect::<Vec<_>>()
                ),
            )],
            &["deadLetter.alarmActions takes at most 5 topics"],
        ),
        row(
            "alarm_actions_without_alarm",
            vec![
                ("/spec/deadLetter/alarm", json!(false)),
                (
                    "/spec/deadLetter/alarmActions",
                    json!(["arn:aws:sns:us-east-1:123456789012:alerts"]),
                ),
            ],
            &["deadLetter.alarmActions needs deadLetter.alarm: true"],
        ),
        row(
            "containers_empty",
            vec![("/spec/template", json!({"spec": {"containers": []}}))],
            &[
                "spec.template.spec: template.spec.containers lists no container",
                "with handler.http the one serving it",
            ],
        ),
        row(
            "containers_empty_exec",
            vec![
                (
                    "/spec/handler",
                    json!({"exec": {"command": ["/app/handle"]}}),
                ),
                ("/spec/template", json!({"spec": {"containers": []}})),
            ],
            &[
                "spec.template.spec: template.spec.containers lists no container",
                "with handler.exec the one whose image holds the command",
            ],
        ),
        row(
            "container_named_qc_worker",
            vec![(
                "/spec/template/spec/containers",
                json!([{"name": "qc-worker", "image": "x"}]),
            )],
            &[
                "spec.template.spec.containers[0]: the container names qc-worker and qc-worker-install are reserved",
                "rename this container",
            ],
        ),
        row(
            "container_named_qc_worker_exec",
            vec![
                ("/spec/handler", json!({"exec": {"command": ["/h"]}})),
                (
                    "/spec/template/spec/containers",
                    json!([{"name": "app", "image": "x"}, {"name": "qc-worker", "image": "y"}]),
                ),
            ],
            &[
                "spec.template.spec.containers[1]: the container names qc-worker and qc-worker-install are reserved",
            ],
        ),
        row(
            "init_container_named_install",
            vec![(
                "/spec/template/spec/initContainers",
                json!([{"name": "qc-worker-install", "image": "x"}]),
            )],
            &[
                "spec.template.spec.initContainers[0]: the container names qc-worker and qc-worker-install are reserved",
            ],
        ),
        row(
            "volume_named_worker_bin",
            vec![(
                "/spec/template/spec/volumes",
                json!([{"name": "qc-worker-bin", "emptyDir": {}}]),
            )],
            &[
                "spec.template.spec.volumes[0]: the volume names qc-worker-bin and qc-rate-share are reserved",
                "rename this volume",
            ],
        ),
        row(
            "http_path_with_crlf",
            vec![(
                "/spec/handler/http/path",
                json!("/messages HTTP/1.1\r\nHost: evil"),
            )],
            &["handler.http.path must start with /", "CR or LF"],
        ),
        row(
            "http_path_relative",
            vec![("/spec/handler/http/path", json!("messages"))],
            &["spec.handler.http.path", "must start with /"],
        ),
        row(
            "http_port_zero",
            vec![("/spec/handler/http/port", json!(0))],
            &["spec.handler.http.port", "between 1 and 65535"],
        ),
        row(
            "http_port_65536",
            vec![("/spec/handler/http/port", json!(65536))],
            &["spec.handler.http.port"],
        ),
        row(
            "exec_command_empty_program",
            vec![("/spec/handler", json!({"exec": {"command": [""]}}))],
            &["spec.handler.exec.command", "must name a program"],
        ),
        row(
            "both_handlers",
            vec![("/spec/handler/exec", json!({"command": ["/h"]}))],
            &["handler must set exactly one of http or exec"],
        ),
        row(
            "batch_size_u32_max",
            vec![("/spec/processing/batchSize", json!(4_294_967_295u64))],
            &["processing.batchSize must be between 1 and 10"],
        ),
        row(
            "wait_time_21s",
            vec![("/spec/processing/waitTime", json!("21s"))],
            &["processing.waitTime must be at most 20s"],
        ),
        row(
            "p99_above_timeout",
            vec![("/spec/processing/p99", json!("31s"))],
            &["processing.p99 must not exceed processing.timeout"],
        ),
        row(
            "duration_with_space",
            vec![("/spec/processing/p99", json!("2 s"))],
            &["spec.processing.p99", "invalid duration"],
        ),
        row(
            "duration_overflow",
            vec![("/spec/processing/timeout", json!("99999999999999999999h"))],
            &["spec.processing.timeout"],
        ),
        row(
            "max_replicas_u32_max",
            vec![("/spec/scaling/maxReplicas", json!(4_294_967_295u64))],
            &["scaling.maxReplicas must be at most 2147483647"],
        ),
        row(
            "min_above_max_replicas",
            vec![
                ("/spec/scaling/minReplicas", json!(5)),
                ("/spec/scaling/maxReplicas", json!(2)),
            ],
            &["scaling.minReplicas must not exceed scaling.maxReplicas"],
        ),
        row(
            "poll_interval_zero",
            vec![("/spec/scaling/pollInterval", json!("0s"))],
            &["scaling.pollInterval must be at least 1s"],
        ),
        row(
            "max_backlog_age_zero",
            vec![("/spec/scaling/maxBacklogAge", json!("0s"))],
            &["scaling.maxBacklogAge must be greater than 0s"],
        ),
        row(
            "worker_cpu_not_a_quantity",
            vec![("/spec/worker/resources/requests/cpu", json!("banana"))],
            &[
                "spec.worker.resources.requests.cpu",
                "not a Kubernetes quantity",
                "50m",
            ],
        ),
        row(
            "worker_memory_wrong_suffix",
            vec![("/spec/worker/resources/limits/memory", json!("128MB"))],
            &["spec.worker.resources.limits.memory", "128Mi"],
        ),
        row(
            "worker_memory_crlf",
            vec![("/spec/worker/resources/limits/memory", json!("1Gi\r\n"))],
            &["spec.worker.resources.limits.memory"],
        ),
        row(
            "worker_extended_resource",
            vec![("/spec/worker/resources/requests/nvidia.com~1gpu", json!(1))],
            &["spec.worker.resources.requests", "unknown field"],
        ),
        row(
            "worker_unknown_field",
            vec![("/spec/worker/image", json!("evil/worker:latest"))],
            &["spec.worker", "unknown field `image`"],
        ),
        row(
            "redis_store_without_secret",
            vec![("/spec/idempotency", json!({"store": "redis"}))],
            &["idempotency.store redis needs idempotency.redis.urlSecretRef"],
        ),
        row(
            "redis_secret_name_empty",
            vec![(
                "/spec/idempotency",
                json!({"store": "redis", "redis": {"urlSecretRef": {"name": "", "key": "url"}}}),
            )],
            &["spec.idempotency.redis.urlSecretRef.name", "required"],
        ),
        row(
            "idempotency_key_without_slash",
            vec![("/spec/idempotency/key", json!("jsonPointer:orderId"))],
            &["spec.idempotency.key"],
        ),
        row(
            "on_poison_unknown",
            vec![("/spec/processing/onPoison", json!("drop"))],
            &["spec.processing.onPoison", "unknown variant"],
        ),
        row(
            "unknown_spec_field",
            vec![("/spec/replicas", json!(3))],
            &["unknown field `replicas`"],
        ),
        row(
            "wrong_api_version",
            vec![("/apiVersion", json!("sqs.consumers.dev/v1"))],
            &["apiVersion", "use sqs.consumers.dev/v1alpha1"],
        ),
        row(
            "name_empty",
            vec![("/metadata/name", json!(""))],
            &["metadata.name", "give the QueueConsumer a name"],
        ),
    ]
}

#[test]
fn manifests_are_rejected_with_the_field_and_the_fix() {
    // The base is valid: each row's error is its own edit's. The worker's own limit is admitted (the
    // CRD and `qc-worker --concurrency` agree).
    assert_eq!(load(&base().to_string()), Ok(()));
    let mut at_limit = base();
    set(
        &mut at_limit,
        "/spec/processing/concurrency",
        json!(qc::worker::MAX_CONCURRENCY),
    );
    assert_eq!(load(&at_limit.to_string()), Ok(()));
    let rows = manifest_rows();
    let mut failures = Vec::new();
    for r in &rows {
        let mut doc = base();
        for (pointer, value) in &r.edits {
            set(&mut doc, pointer, value.clone());
        }
        match load(&doc.to_string()) {
            Ok(()) => failures.push(format!("{}: accepted", r.name)),
            Err(errors) => {
                if !errors
                    .iter()
                    .any(|e| r.expect.iter().all(|want| e.contains(want)))
                {
                    failures.push(format!(
                        "{}: expected {:?} in one of {errors:?}",
                        r.name, r.expect
                    ));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(rows.len() >= 40, "{} rows", rows.len());
}

/// Whole documents that are not even a manifest: an error, never a panic or a hang.
#[test]
fn broken_documents_fail_cleanly() {
    let laughs = {
        let mut s = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for i in 0..12 {
            let prev = if i == 0 {
                "a".to_string()
            } else {
                format!("l{}", i - 1)
            };
            s.push_str(&format!("l{i}: &l{i} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"));
        }
        s
    };
    let rows: Vec<(&str, String)> = vec![
        ("alias_expansion_bomb", laughs),
        ("deep_nesting", "[".repeat(100_000)),
        ("nul_bytes", "\u{0}\u{1}".into()),
        ("spec_is_a_number", "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {name: x}\nspec: 3\n".into()),
        ("duplicate_spec_key", format!("{}\nspec: {{}}\n", serde_json_to_yaml_ish())),
        ("tab_indentation", "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata:\n\tname: x\n".into()),
    ];
    for (name, text) in rows {
        let started = std::time::Instant::now();
        let verdict = load(&text);
        assert!(verdict.is_err(), "{name}: accepted");
        eprintln!(
            "{name}: rejected in {:?}: {:?}",
            started.elapsed(),
            verdict
                .unwrap_err()
                .first()
                .map(|e| e.chars().take(160).collect::<String>())
        );
    }
}

/// The base manifest as flow YAML (JSON is YAML), to which a row appends a second `spec` key.
fn serde_json_to_yaml_ish() -> String {
    let b = base();
    format!(
        "apiVersion: {}\nkind: {}\nmetadata: {}\nspec: {}",
        b["apiVersion"], b["kind"], b["metadata"], b["spec"]
    )
}

/// `spec.queue.endpoint` values the controller refuses by default: no request is sent to them
/// (tests/controller_safety.rs proves "no request" against a listener); and bad operator patterns.
#[test]
fn endpoints_are_refused_unless_the_operator_allows_them() {
    let aws_only = AllowedEndpoints::aws_only();
    let refused: &[(&str, &str)] = &[
        ("endpoint_instance_metadata", "http://169.254.169.254"),
        (
            "endpoint_instance_metadata_path",
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        ),
        ("endpoint_ecs_credentials", "http://169.254.170.2"),
        (
            "endpoint_lookalike_host",
            "https://sqs.us-east-1.amazonaws.com.evil.example",
        ),
        (
            "endpoint_userinfo_trick",
            "https://sqs.us-east-1.amazonaws.com@evil.example",
        ),
        (
            "endpoint_api_gateway_under_amazonaws",
            "https://a1b2c3d4e5.execute-api.us-east-1.amazonaws.com",
        ),
        (
            "endpoint_s3_bucket_named_sqs",
            "https://sqs.us-east-1.s3.amazonaws.com",
        ),
        (
            "endpoint_aws_over_plain_http",
            "http://sqs.us-east-1.amazonaws.com",
        ),
        ("endpoint_kubernetes_api", "https://kubernetes.default.svc"),
        ("endpoint_policy_with_crlf", "http://localhost:4566\r\nX: y"),
    ];
    for (name, endpoint) in refused {
        let e = aws_only.check(endpoint).expect_err(name);
        let msg = e.to_string();
        assert_eq!(e.reason(), "EndpointNotAllowed", "{name}");
        assert!(
            msg.contains("spec.queue.endpoint") && msg.contains("aws.allowedEndpoints"),
            "{name}: {msg}"
        );
    }
    let bad_patterns: &[(&str, &str)] = &[
        ("allowed_pattern_without_scheme", "moto:5000"),
        ("allowed_pattern_mid_wildcard", "http://sqs.*.example"),
        ("allowed_pattern_with_path", "http://moto:5000/queues"),
        ("allowed_pattern_port_zero", "http://moto:0"),
    ];
    for (name, pattern) in bad_patterns {
        let e = AllowedEndpoints::parse([pattern]).expect_err(name);
        assert_eq!(e.reason(), "InvalidAllowedEndpoint", "{name}");
        assert!(e.to_string().contains(pattern), "{name}: {e}");
        assert!(
            e.to_string().contains("SCHEME://HOST[:PORT]"),
            "{name}: {e}"
        );
    }
}

fn operator() -> Command {
    Command::new(env!("CARGO_BIN_EXE_qc-operator"))
}

/// `qc-operator check` end to end: exit 2 (invalid input) and the field in its output.
#[test]
fn check_exits_2_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("qc-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows: Vec<(&str, Edits, &str)> = vec![
        (
            "check_concurrency_u32_max",
            vec![("/spec/processing/concurrency", json!(4_294_967_295u64))],
            "processing.concurrency must be at most 10000",
        ),
        (
            "check_containers_empty",
            vec![("/spec/template", json!({"spec": {"containers": []}}))],
            "spec.template.spec: template.spec.containers lists no container",
        ),
        (
            "check_region_with_crlf",
            vec![("/spec/queue/region", json!("us-east-1\r\n"))],
            "queue.region must be an AWS region",
        ),
        (
            "check_container_named_qc_worker",
            vec![(
                "/spec/template/spec/containers",
                json!([{"name": "qc-worker", "image": "x"}]),
            )],
            "spec.template.spec.containers[0]: the container names qc-worker and qc-worker-install are reserved for the worker",
        ),
    ];
    for (name, edits, expect) in rows {
        let mut doc = base();
        for (p, v) in edits {
            set(&mut doc, p, v);
        }
        let file = dir.join(format!("{name}.yaml"));
        std::fs::write(&file, doc.to_string()).unwrap();
        let out = operator().arg("check").arg(&file).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(2), "{name}: {text}");
        assert!(text.contains(expect), "{name}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `qc-operator run` refuses a bad allow-list before it touches the cluster.
#[test]
fn run_rejects_a_bad_allowed_endpoint_at_start() {
    let rows: [(&str, &[&str], Option<&str>, &str); 2] = [
        (
            "run_flag_ftp_pattern",
            &["--allowed-endpoint", "ftp://moto:5000"],
            None,
            "ftp://moto:5000",
        ),
        (
            "run_env_mid_wildcard",
            &[],
            Some("http://sqs.*.example"),
            "http://sqs.*.example",
        ),
    ];
    for (name, args, env, expect) in rows {
        let mut cmd = operator();
        cmd.arg("run").args(args).env_remove("QC_ALLOWED_ENDPOINTS");
        // Never reach a real cluster, whatever the machine's kubeconfig says.
        cmd.env("KUBECONFIG", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST");
        if let Some(v) = env {
            cmd.env("QC_ALLOWED_ENDPOINTS", v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(
            text.contains("--allowed-endpoint")
                && text.contains("aws.allowedEndpoints")
                && text.contains(expect),
            "{name}: {text}"
        );
    }
}

const CHART: &str = "charts/queue-consumer-operator";

fn helm() -> Option<PathBuf> {
    let cache = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/queue-consumer-operator/bin"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = cache
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join("helm"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("QC_REQUIRE_HELM").as_deref() != Ok("1"),
            "helm is required (QC_REQUIRE_HELM=1) but not found: source scripts/lib.sh and run ensure_helm"
        );
        eprintln!("skipped: helm not found (scripts/test installs it)");
    }
    found
}

fn helm_template(args: &[&str]) -> Option<Result<String, String>> {
    let out = Command::new(helm()?)
        .args(["template", "qc", CHART, "--namespace", "qc-system"])
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    Some(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

/// Chart values: the schema names the value; a good list becomes the controller's flags.
#[test]
fn chart_values_for_allowed_endpoints() {
    let rows: [(&str, &str); 4] = [
        (
            "chart_allowed_endpoints_without_scheme",
            r#"aws.allowedEndpoints=["moto:5000"]"#,
        ),
        (
            "chart_allowed_endpoints_a_string",
            r#"aws.allowedEndpoints="http://moto:5000""#,
        ),
        (
            "chart_allowed_endpoints_with_path",
            r#"aws.allowedEndpoints=["http://moto:5000/queues"]"#,
        ),
        (
            "chart_allowed_endpoints_with_crlf",
            "aws.allowedEndpoints=[\"http://moto:5000\\r\\n\"]",
        ),
    ];
    for (name, value) in rows {
        let Some(result) = helm_template(&["--set-json", value]) else {
            return;
        };
        match result {
            Ok(_) => panic!("{name}: rendered; it must fail"),
            Err(msg) => assert!(msg.contains("allowedEndpoints"), "{name}: {msg}"),
        }
    }
    let Some(ok) = helm_template(&[
        "--set-json",
        r#"aws.allowedEndpoints=["http://moto.test.svc:5000","https://*.sqs.example.internal:*"]"#,
    ]) else {
        return;
    };
    let ok = ok.unwrap();
    assert!(
        ok.contains("\"--allowed-endpoint=http://moto.test.svc:5000\""),
        "{ok}"
    );
    assert!(
        ok.contains("\"--allowed-endpoint=https://*.sqs.example.internal:*\""),
        "{ok}"
    );
    let default = helm_template(&[]).unwrap().unwrap();
    assert!(
        !default.contains("--allowed-endpoint"),
        "default: AWS's own endpoints only"
    );
}

/// `qc-operator run` refuses a bad tenancy policy before it touches the cluster, naming the rule.
#[test]
fn run_rejects_a_bad_tenancy_policy_at_start() {
    let rows: [(&str, &[&str], Option<&str>, &str); 2] = [
        (
            "run_flag_queue_not_an_arn",
            &[
                "--tenancy-policy",
                r#"{"rules":[{"namespaces":["a"],"queues":["team-a-*"]}]}"#,
            ],
            None,
            "rules[0].queues",
        ),
        (
            "run_env_unknown_field",
            &[],
            Some("rules: [{namespaces: [a], roles: [x]}]"),
            "roles",
        ),
    ];
    for (name, args, env, expect) in rows {
        let mut cmd = operator();
        cmd.arg("run").args(args).env_remove("QC_TENANCY_POLICY");
        cmd.env("KUBECONFIG", "/nonexistent")
            .env_remove("KUBERNETES_SERVICE_HOST");
        if let Some(v) = env {
            cmd.env("QC_TENANCY_POLICY", v);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name}");
        assert!(
            text.contains("--tenancy-policy") && text.contains("tenancy") && text.contains(expect),
            "{name}: {text}"
        );
    }
}

/// Chart values of the tenancy policy: the schema names the value; rules become the controller's
/// QC_TENANCY_POLICY, which the controller reads as the same policy; the default sets nothing.
#[test]
fn chart_values_for_the_tenancy_policy() {
    let rows: [(&str, &str); 4] = [
        (
            "chart_tenancy_rule_without_namespaces",
            r#"tenancy.rules=[{"queues":["*"]}]"#,
        ),
        (
            "chart_tenancy_unknown_field",
            r#"tenancy.rules=[{"namespaces":["a"],"role":"x"}]"#,
        ),
        (
            "chart_tenancy_queue_not_an_arn",
            r#"tenancy.rules=[{"namespaces":["a"],"queues":["team-a-*"]}]"#,
        ),
        (
            "chart_tenancy_namespace_uppercase",
            r#"tenancy.rules=[{"namespaces":["Team-A"]}]"#,
        ),
    ];
    for (name, value) in rows {
        let Some(result) = helm_template(&["--set-json", value]) else {
            return;
        };
        match result {
            Ok(_) => panic!("{name}: rendered; it must fail"),
            Err(msg) => assert!(msg.contains("tenancy"), "{name}: {msg}"),
        }
    }
    let preset = r#"tenancy.rules=[{"namespaces":["*"],"requireRoleArn":true,"roleArns":["arn:aws:iam::*:role/qc-{namespace}_*"],"queues":["arn:aws:sqs:*:*:{namespace}_*"]}]"#;
    let Some(ok) = helm_template(&["--set-json", preset]) else {
        return;
    };
    let ok = ok.unwrap();
    let docs: Vec<Value> = ok
        .split("\n---")
        .filter_map(|d| serde_saphyr::from_str::<Value>(d).ok())
        .collect();
    let env = docs
        .iter()
        .filter(|d| d["kind"] == "Deployment")
        .filter_map(|d| {
            d["spec"]["template"]["spec"]["containers"][0]["env"]
                .as_array()
                .cloned()
        })
        .flatten()
        .find(|e| e["name"] == "QC_TENANCY_POLICY")
        .unwrap_or_else(|| panic!("no QC_TENANCY_POLICY in {ok}"));
    let policy = qc::tenancy::TenancyPolicy::parse(env["value"].as_str().unwrap()).unwrap();
    let url = "https://sqs.us-east-1.amazonaws.com/111111111111/team-a_orders";
    let tenant = |ns, role| qc::tenancy::Tenant {
        namespace: ns,
        queue_url: url,
        region: Some("us-east-1"),
        role_arn: role,
        buckets: &[],
        alarm_actions: &[],
    };
    assert!(
        policy.check(&tenant("team-a", None)).is_err(),
        "the preset requires a role"
    );
    policy
        .check(&tenant(
            "team-a",
            Some("arn:aws:iam::111111111111:role/qc-team-a_orders"),
        ))
        .unwrap();
    assert!(
        policy
            .check(&tenant(
                "team-b",
                Some("arn:aws:iam::111111111111:role/qc-team-b_orders")
            ))
            .is_err(),
        "another namespace's queue"
    );
    let default = helm_template(&[]).unwrap().unwrap();
    assert!(
        !default.contains("QC_TENANCY_POLICY"),
        "default: no rules, one tenant"
    );
}
