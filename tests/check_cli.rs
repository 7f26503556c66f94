//! `qc-operator check` as a user runs it: real binary, real files, exit codes and output.

use std::path::Path;
use std::process::Command;

fn qc_operator(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("qc-operator runs");
    (
        out.status.code().expect("exit code"),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn samples() -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples"))
            .expect("samples dir")
            .map(|e| e.expect("entry").path())
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("sqs_"))
            })
            .map(|p| p.display().to_string())
            .collect();
    v.sort();
    v
}

#[test]
fn samples_pass_offline_with_no_error() {
    let files = samples();
    assert!(files.len() >= 3, "http, exec and fifo samples: {files:?}");
    let args: Vec<&str> = std::iter::once("check")
        .chain(files.iter().map(String::as_str))
        .collect();
    let (code, out, err) = qc_operator(&args);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains(&format!(
            "{} QueueConsumer(s) checked: 0 error(s)",
            files.len()
        )),
        "{out}"
    );
    assert!(
        out.contains("skipped  14 rules that need queue facts"),
        "offline names the skipped rules: {out}"
    );
}

#[test]
fn attributes_file_runs_queue_rules_and_exits_1_on_errors() {
    let sample = "config/samples/sqs_v1alpha1_queueconsumer_http.yaml";
    let (code, out, err) = qc_operator(&[
        "check",
        sample,
        "--attributes",
        "tests/data/attributes_risky.json",
    ]);
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    // p99 2s, concurrency 20, batchSize 10, heartbeat on: 40 in flight (20 running and up to one
    // message a slot held ahead: a waiting batch and up to 10 more on their way),
    // budget 2s × 2 + 5s = 9s > VT 5s (Warning); auto heartbeat 1s66 >= 5s - 5s (Error)
    for code in [
        "VisibilityTimeoutBelowBudget",
        "HeartbeatIntervalTooLong",
        "MaxReceiveCountTooLow",
        // retention 1h, not above the breaker's default 1h hold
        "OutageHoldBeyondRetention",
    ] {
        assert!(out.contains(code), "{code} missing from:\n{out}");
    }
    assert!(
        out.contains(
            "below the budget 9s (p99 2s × ceil(40 in flight / concurrency 20) + margin 5s)"
        ),
        "{out}"
    );
    assert!(
        out.contains("set VisibilityTimeout to at least 9s"),
        "{out}"
    );
    // mean 400ms × 6 = 2.4s is below VT 5s: that rule stays quiet
    assert!(!out.contains("VisibilityTimeoutBelowSixTimesMean"), "{out}");
    assert!(out.contains("1 error(s), 3 warning(s)"), "{out}");
    assert!(
        out.contains("rules that need the dead-letter queue's attributes; add --dlq-attributes"),
        "{out}"
    );
}

#[test]
fn json_output_is_stable_and_complete() {
    let sample = "config/samples/sqs_v1alpha1_queueconsumer_http.yaml";
    let (code, out, _) = qc_operator(&[
        "check",
        sample,
        "--attributes",
        "tests/data/attributes_healthy.json",
        "--dlq-attributes",
        "tests/data/attributes_dlq_short.json",
        "--output",
        "json",
    ]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("stdout is JSON");
    let items = v.as_array().expect("a JSON array");
    let codes: Vec<&str> = items
        .iter()
        .map(|f| f["code"].as_str().expect("code"))
        .collect();
    assert_eq!(
        codes,
        ["DeadLetterRetentionTooShort", "DeadLetterQueueTypeMismatch"],
        "{out}"
    );
    for item in items {
        let keys: Vec<&String> = item.as_object().expect("object").keys().collect();
        assert_eq!(
            keys,
            [
                "code",
                "file",
                "message",
                "name",
                "recommendation",
                "severity"
            ]
        );
        assert_eq!(item["file"], sample);
        assert_eq!(item["name"], "shop/orders");
    }
    assert_eq!(items[1]["severity"], "Error");
}

#[test]
fn healthy_queue_with_dlq_passes() {
    let sample = "config/samples/sqs_v1alpha1_queueconsumer_http.yaml";
    let (code, out, err) = qc_operator(&[
        "check",
        sample,
        "--attributes",
        "tests/data/attributes_healthy.json",
        "--output",
        "json",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.trim(), "[]");
}

#[test]
fn a_disabled_breaker_on_a_queue_with_a_dlq_is_a_warning() {
    let (code, out, err) = qc_operator(&[
        "check",
        "tests/data/breaker_off.yaml",
        "--attributes",
        "tests/data/attributes_healthy.json",
    ]);
    assert_eq!(code, 0, "a Warning only: {out}{err}");
    assert!(out.contains("BreakerDisabled"), "{out}");
    assert!(
        out.contains("set processing.breaker.enabled to true"),
        "{out}"
    );
    // The same spec with the breaker on (the default) is clean on that queue.
    let (code, out, _) = qc_operator(&[
        "check",
        "config/samples/sqs_v1alpha1_queueconsumer_http.yaml",
        "--attributes",
        "tests/data/attributes_healthy.json",
    ]);
    assert_eq!(code, 0);
    assert!(!out.contains("BreakerDisabled"), "{out}");
    // Offline the rule needs the queue: named among the skipped ones, not fired.
    let (code, out, _) = qc_operator(&["check", "tests/data/breaker_off.yaml", "--output", "json"]);
    assert_eq!(code, 0);
    assert!(!out.contains("BreakerDisabled"), "{out}");
}

/// #40 item 7: `unwrapSns: "on"` with `onPoison: delete` deletes every message once raw delivery is
/// switched on; check refuses it offline, naming both fields and the fix.
#[test]
fn unwrap_sns_on_with_poison_deleted_is_an_error() {
    let (code, out, err) = qc_operator(&["check", "tests/data/unwrap_sns_poison_deleted.yaml"]);
    assert_eq!(code, 1, "an Error finding: {out}{err}");
    for needle in [
        "UnwrapSnsPoisonDeleted",
        "handler.unwrapSns",
        "processing.onPoison",
        "set handler.unwrapSns to \"auto\"",
    ] {
        assert!(out.contains(needle), "{needle} missing from {out}");
    }
    let (code, out, _) = qc_operator(&[
        "check",
        "tests/data/unwrap_sns_poison_deleted.yaml",
        "--output",
        "json",
    ]);
    assert_eq!(code, 1);
    let findings: serde_json::Value = serde_json::from_str(&out).expect("JSON output");
    let f = findings
        .as_array()
        .and_then(|fs| fs.iter().find(|f| f["code"] == "UnwrapSnsPoisonDeleted"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(f["severity"], "Error", "{f}");
    assert!(
        f["recommendation"]
            .as_str()
            .is_some_and(|r| r.contains("processing.onPoison to deadLetter")),
        "{f}"
    );
}

/// #40 item 5: deleting S3 payloads beside unwrapSns is an Error offline (exit 1), naming both fields
/// and the fix.
#[test]
fn s3_payload_delete_with_unwrap_sns_is_an_error() {
    let (code, out, err) = qc_operator(&["check", "tests/data/s3_delete_with_sns.yaml"]);
    assert_eq!(code, 1, "{out}{err}");
    for needle in [
        "S3PayloadDeleteWithSns",
        "handler.s3Payloads.deleteAfterProcessing",
        "handler.unwrapSns",
        "set handler.s3Payloads.deleteAfterProcessing to false",
        "lifecycle rule",
    ] {
        assert!(out.contains(needle), "{needle} missing from {out}");
    }
}

#[test]
fn out_of_range_breaker_settings_name_the_field_and_exit_2() {
    let (code, out, err) = qc_operator(&["check", "tests/data/breaker_invalid.yaml"]);
    assert_eq!(code, 2, "{out}{err}");
    for needle in [
        "processing.breaker.failurePercent must be between 1 and 100",
        "processing.breaker.window must be between 2 and 1000",
        "processing.breaker.probeBackoff.base must not exceed probeBackoff.max",
    ] {
        assert!(out.contains(needle), "{needle} missing from {out}");
    }
}

#[test]
fn invalid_manifest_names_the_field_and_exits_2() {
    let (code, out, err) = qc_operator(&["check", "tests/data/invalid.yaml"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(out.contains("skipped ConfigMap unrelated"), "{out}");
    assert!(
        out.contains("spec.processing.p99: invalid duration \"2 seconds\""),
        "{out}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // the JSON mode sends the same error to stderr and keeps stdout parseable
    let (code, out, err) = qc_operator(&["check", "tests/data/invalid.yaml", "--output", "json"]);
    assert_eq!(code, 2);
    assert_eq!(out.trim(), "[]");
    assert!(err.contains("spec.processing.p99"), "{err}");
}

/// #44 item 4: durations as users write them pass `check`; one that is no duration is refused naming
/// the field, the value and examples, and exits 2.
#[test]
fn decimal_durations_pass_and_a_bad_one_names_field_value_and_example() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = |p99: &str, timeout: &str| {
        format!(
            "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {{name: orders, namespace: shop}}\nspec:\n  queue: {{url: https://sqs.us-east-1.amazonaws.com/123456789012/orders}}\n  processing: {{p99: \"{p99}\", timeout: \"{timeout}\", retryBackoff: {{base: 500ms, max: 0.25h}}, heartbeat: {{interval: 2.5s}}}}\n  handler: {{http: {{}}}}\n"
        )
    };
    let good = dir.path().join("good.yaml");
    std::fs::write(&good, manifest("1.5s", "1m30s")).unwrap();
    let (code, out, err) = qc_operator(&["check", good.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    for (p99, timeout, says) in [
        (
            "1.5x",
            "30s",
            "spec.processing.p99: invalid duration \"1.5x\": write a number and a unit (ms, s, m or h), e.g. 30s, 1.5s, 1m30s, 500ms",
        ),
        (
            "1s",
            "1,5s",
            "spec.processing.timeout: invalid duration \"1,5s\": write a number and a unit",
        ),
        (
            "1.5ms",
            "30s",
            "spec.processing.p99: invalid duration \"1.5ms\": durations count whole milliseconds, so a decimal takes at most 3 places and only on s, m or h, e.g. 1.5s",
        ),
    ] {
        let bad = dir.path().join("bad.yaml");
        std::fs::write(&bad, manifest(p99, timeout)).unwrap();
        let (code, out, err) = qc_operator(&["check", bad.to_str().unwrap()]);
        assert_eq!(code, 2, "{out}{err}");
        assert!(out.contains(says), "{out}");
    }
}

#[test]
fn unreadable_inputs_exit_2() {
    let (code, _, err) = qc_operator(&["check", "tests/data/does-not-exist.yaml"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("cannot read tests/data/does-not-exist.yaml"),
        "{err}"
    );
    let sample = "config/samples/sqs_v1alpha1_queueconsumer_http.yaml";
    let (code, out, _) = qc_operator(&["check", sample, "--attributes", "tests/data/invalid.yaml"]);
    assert_eq!(code, 2);
    assert!(
        out.contains("cannot read queue facts") && out.contains("not valid JSON"),
        "{out}"
    );
    let (code, _, err) = qc_operator(&["check", "Cargo.toml"]);
    assert_eq!(code, 2, "{err}");
}
