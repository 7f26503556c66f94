//! `qc-operator check --live` against real queues on moto: the rules see the real settings.

mod common;

use std::process::Command;

use aws_sdk_sqs::types::QueueAttributeName as A;

fn manifest(dir: &std::path::Path, url: &str, endpoint: Option<&str>) -> std::path::PathBuf {
    let endpoint = endpoint
        .map(|e| format!("\n    endpoint: {e}"))
        .unwrap_or_default();
    let text = format!(
        "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {{name: live, namespace: t}}\nspec:\n  queue:\n    url: {url}{endpoint}\n  processing: {{p99: 2s, heartbeat: {{enabled: false}}}}\n  handler: {{http: {{}}}}\n"
    );
    let path = dir.join("qc.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn check(args: &[&str], endpoint_env: Option<&str>) -> (i32, String, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_qc-operator"));
    cmd.arg("check").args(args).env_remove("AWS_ENDPOINT_URL");
    if let Some(e) = endpoint_env {
        cmd.env("AWS_ENDPOINT_URL", e);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

async fn create(client: &aws_sdk_sqs::Client, name: &str, attrs: &[(A, &str)]) -> (String, String) {
    let attrs: Vec<_> = attrs
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    let url = common::create_queue(client, name, &attrs).await;
    let arn = common::queue_arn(client, &url).await;
    (url, arn)
}

#[tokio::test]
async fn live_check_reads_queue_and_dlq() {
    let client = common::sqs_client().await;
    let (_, dlq_arn) = create(
        &client,
        &common::unique_name("live-dlq"),
        &[(A::MessageRetentionPeriod, "86400")],
    )
    .await;
    let redrive = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"2"}}"#);
    let (url, _) = create(
        &client,
        &common::unique_name("live-src"),
        &[(A::VisibilityTimeout, "5"), (A::RedrivePolicy, &redrive)],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = manifest(dir.path(), &url, Some(&common::sqs_endpoint()));
    let allow = common::sqs_endpoint();
    let (code, out, err) = check(
        &[
            "--live",
            "--allowed-endpoint",
            &allow,
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 1, "stdout:\n{out}\nstderr:\n{err}");
    // VT 5s < budget 7s, heartbeat off: Error; R = 2; DLQ keeps 1 day
    for expected in [
        "Error    VisibilityTimeoutBelowBudget",
        "MaxReceiveCountTooLow",
        "DeadLetterRetentionTooShort",
    ] {
        assert!(out.contains(expected), "{expected} missing:\n{out}");
    }
    assert!(!out.contains("skipped"), "live runs every rule:\n{out}");

    // JSON, with the endpoint from the SDK's environment instead of the spec
    let file = manifest(dir.path(), &url, None);
    let (code, out, _) = check(
        &["--live", "--output", "json", file.to_str().unwrap()],
        Some(&common::sqs_endpoint()),
    );
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let codes: Vec<&str> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["code"].as_str().unwrap())
        .collect();
    // timeout 30s > VT 5s with the heartbeat off also fires
    assert_eq!(
        codes,
        [
            "VisibilityTimeoutBelowBudget",
            "HandlerTimeoutBeyondVisibility",
            "MaxReceiveCountTooLow",
            "DeadLetterRetentionTooShort"
        ]
    );
}

#[tokio::test]
async fn live_check_reports_missing_dlq_and_missing_queue() {
    let client = common::sqs_client().await;
    let (dlq_url, dlq_arn) = create(&client, &common::unique_name("gone-dlq"), &[]).await;
    let redrive = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":5}}"#);
    let (url, _) = create(
        &client,
        &common::unique_name("orphan"),
        &[(A::RedrivePolicy, &redrive)],
    )
    .await;
    client
        .delete_queue()
        .queue_url(&dlq_url)
        .send()
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = manifest(dir.path(), &url, Some(&common::sqs_endpoint()));
    let allow = common::sqs_endpoint();
    let live = [
        "--live",
        "--allowed-endpoint",
        &allow,
        file.to_str().unwrap(),
    ];
    let (code, out, err) = check(&live, None);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("Error    DeadLetterQueueMissing"), "{out}");
    assert!(out.contains(&dlq_arn), "{out}");

    // the source queue itself is gone: unreadable input, exit 2, with the reason
    client.delete_queue().queue_url(&url).send().await.unwrap();
    let (code, out, err) = check(&live, None);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("cannot read queue facts") && out.contains("does not exist"),
        "{out}"
    );
}

/// #29 item 5: `--live` obeys the same endpoint allow-list as the controller. A manifest naming an
/// endpoint nobody allowed gets no request at all (this machine's signed requests carry its key id
/// and session token), exit 2 naming the field and the flag; `plan --live` the same.
#[test]
fn live_sends_nothing_to_an_endpoint_nobody_allowed() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let dir = tempfile::tempdir().unwrap();
    let file = manifest(
        dir.path(),
        "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
        Some(&endpoint),
    );
    let (code, out, err) = check(&["--live", file.to_str().unwrap()], None);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        out.contains("spec.queue.endpoint") && out.contains("--allowed-endpoint"),
        "{out}"
    );
    let plan = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(["plan", "--live", file.to_str().unwrap()])
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .unwrap();
    assert_eq!(plan.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&plan.stderr);
    assert!(stderr.contains("--allowed-endpoint"), "{stderr}");
    assert!(
        listener.accept().is_err(),
        "a request reached the endpoint nobody allowed"
    );
    // Allowed, it is asked (and, serving nothing, fails as an unreadable queue).
    let allowed = std::thread::spawn(move || {
        listener.set_nonblocking(false).unwrap();
        listener.accept().is_ok()
    });
    let (code, out, err) = check(
        &[
            "--live",
            "--allowed-endpoint",
            &endpoint,
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(code, 2, "{out}{err}");
    assert!(allowed.join().unwrap(), "the allowed endpoint was asked");
}

/// #48: a filter deletes what it does not match, so `check --live` warns (FilterOnBacklog) when the
/// queue already holds messages, and says nothing of it on an empty queue or without a filter. A
/// pattern that does not parse is an Error with its position, live or not.
#[tokio::test]
async fn live_check_warns_of_a_filter_on_a_queue_with_a_backlog() {
    let client = common::sqs_client().await;
    let (url, _) = create(&client, &common::unique_name("live-filter"), &[]).await;
    let dir = tempfile::tempdir().unwrap();
    let write = |filter: &str| {
        let path = dir.path().join("qc.yaml");
        std::fs::write(
            &path,
            format!(
                "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {{name: live, namespace: t}}\nspec:\n  queue:\n    url: {url}\n  processing: {{p99: 2s}}\n  handler: {{http: {{}}}}\n{filter}"
            ),
        )
        .unwrap();
        path
    };
    let allow = common::sqs_endpoint();
    let run = |path: &std::path::Path| {
        check(
            &[
                "--live",
                "--allowed-endpoint",
                &allow,
                path.to_str().unwrap(),
            ],
            Some(&common::sqs_endpoint()),
        )
    };
    let filter = "  filter:\n    patterns: ['{\"body\": {\"type\": [\"order\"]}}']\n";
    let (_, out, err) = run(&write(filter));
    assert!(
        !out.contains("FilterOnBacklog"),
        "empty queue:\n{out}\n{err}"
    );

    client
        .send_message()
        .queue_url(&url)
        .message_body("{\"type\":\"refund\"}")
        .send()
        .await
        .unwrap();
    let (_, out, err) = run(&write(filter));
    assert!(
        out.contains("Warning  FilterOnBacklog") && out.contains("about 1 message"),
        "one message waiting:\n{out}\n{err}"
    );
    let (_, out, _) = run(&write(""));
    assert!(!out.contains("FilterOnBacklog"), "no filter:\n{out}");

    let (code, out, err) = run(&write(
        "  filter:\n    patterns: ['{\"body\": {\"type\": [{\"prefx\": \"o\"}]}}']\n",
    ));
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("Error    FilterPatternInvalid")
            && out.contains("filter.patterns[0] at body.type[0].prefx"),
        "{out}"
    );
}
