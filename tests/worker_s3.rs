//! `--s3-payloads` (#32 item 3) against moto's S3 and SQS: messages of the Amazon SQS Extended
//! Client, whose body points at an S3 object, reach the handler with the object's bytes; a missing
//! object is poison (the pointer goes to the DLQ with the reason); S3 unreachable is a retry, never
//! a handler call with the pointer.

#[path = "common/mod.rs"]
mod common;
#[path = "worker/support.rs"]
mod support;

use std::time::Duration;

use aws_sdk_sqs::types::MessageAttributeValue;
use support::*;

const SECS: fn(u64) -> Duration = Duration::from_secs;
const CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";

async fn s3() -> aws_sdk_s3::Client {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&conf)
            .force_path_style(true)
            .build(),
    )
}

async fn bucket(s3: &aws_sdk_s3::Client) -> String {
    let name = common::unique_name("payloads").to_lowercase();
    s3.create_bucket().bucket(&name).send().await.unwrap();
    name
}

/// Sends what the Extended Client sends for a payload in `bucket`/`key` of `size` bytes.
async fn send_pointer(q: &TestQueue, bucket: &str, key: &str, size: usize) {
    let body = format!(r#"["{CLASS}",{{"s3BucketName":"{bucket}","s3Key":"{key}"}}]"#);
    q.client
        .send_message()
        .queue_url(&q.url)
        .message_body(body)
        .message_attributes(
            "ExtendedPayloadSize",
            MessageAttributeValue::builder()
                .data_type("Number")
                .string_value(size.to_string())
                .build()
                .unwrap(),
        )
        .message_attributes(
            "tenant",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value("t-7")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
}

/// A 300 KiB payload (over SQS's 256 KiB) reaches the handler as the body, with the message's own
/// attributes but not the size attribute; with --s3-delete-after the object is deleted once the
/// message is; a plain message on the same queue is handled as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_reaches_the_handler_as_its_payload_and_the_object_is_deleted_after() {
    let q = TestQueue::new("s3-ok", 30, 3, false).await;
    let s3 = s3().await;
    let b = bucket(&s3).await;
    let payload: String = (0..300 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    s3.put_object()
        .bucket(&b)
        .key("orders/1.json")
        .body(payload.clone().into_bytes().into())
        .send()
        .await
        .unwrap();
    send_pointer(&q, &b, "orders/1.json", payload.len()).await;
    q.send_one("plain").await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--s3-payloads",
        "--s3-bucket",
        &b,
        "--s3-delete-after",
    ]));
    eventually(SECS(30), "both handled and deleted", || q.is_empty()).await;
    let calls = h.calls();
    assert_eq!(calls.len(), 2, "each once");
    let big = calls
        .iter()
        .find(|c| c.body.len() > 1000)
        .expect("the payload");
    assert_eq!(big.body, payload.as_bytes(), "the object's bytes");
    assert_eq!(
        big.headers
            .get("x-sqs-attribute-tenant")
            .map(String::as_str),
        Some("t-7")
    );
    assert!(
        !big.headers
            .contains_key("x-sqs-attribute-extendedpayloadsize"),
        "the size attribute is the client's, not the handler's"
    );
    assert!(calls.iter().any(|c| c.body == b"plain"));
    eventually(SECS(10), "the object deleted", || async {
        s3.head_object()
            .bucket(&b)
            .key("orders/1.json")
            .send()
            .await
            .is_err()
    })
    .await;
    w.stop().await;
}

/// An object that does not exist is poison: no handler call, and the pointer (as sent) goes to the
/// DLQ with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_object_is_poison_and_the_pointer_reaches_the_dlq() {
    let q = TestQueue::new("s3-missing", 30, 3, false).await;
    let s3 = s3().await;
    let b = bucket(&s3).await;
    send_pointer(&q, &b, "gone.json", 400_000).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start(&q.args(&["--http-url", &h.url, "--s3-payloads", "--s3-bucket", &b]));
    eventually(SECS(30), "dead-lettered", || async {
        q.dlq_visible().await == 1
    })
    .await;
    assert!(h.calls().is_empty(), "the handler never saw the pointer");
    let got = drain_dlq(&q).await;
    assert_eq!(got.len(), 1);
    let (body, attrs, _) = &got[0];
    assert!(body.contains(CLASS) && body.contains("gone.json"), "{body}");
    let reason = attrs.get("qc-poison-reason").cloned().unwrap_or_default();
    assert!(reason.contains("NoSuchKey"), "{attrs:?}");
    w.stop().await;
}

/// S3 unreachable (its endpoint refuses connections): a retry, never a handler call with the
/// pointer, and the message stays on the queue (not in the DLQ).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_unreachable_is_a_retry_not_a_call_or_poison() {
    let q = TestQueue::new("s3-down", 30, 10, false).await;
    send_pointer(&q, "somebucket", "k.json", 400_000).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    // SQS through moto, S3 at a port nobody listens on.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let args = q.args(&[
        "--http-url",
        &h.url,
        "--s3-payloads",
        "--s3-bucket",
        "somebucket",
        "--retry-base",
        "1s",
        "--retry-max",
        "1s",
    ]);
    let mut cut = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        if a == "--endpoint-url" {
            it.next();
        } else {
            cut.push(a);
        }
    }
    let mut w = Worker::start_with_env(
        std::sync::Arc::new(tempfile::tempdir().unwrap()),
        &cut,
        &[
            ("AWS_ENDPOINT_URL_SQS", &common::sqs_endpoint()),
            ("AWS_ENDPOINT_URL_S3", &dead),
            ("AWS_MAX_ATTEMPTS", "1"),
        ],
    );
    eventually(SECS(30), "two failed fetches", || async {
        w.metric("qc_worker_messages_processed_total{outcome=\"transient\"}")
            .await
            .unwrap_or(0.0)
            >= 2.0
    })
    .await;
    assert!(h.calls().is_empty(), "no call without the payload");
    assert_eq!(q.dlq_visible().await, 0);
    let (visible, in_flight, _) = q.counts().await;
    assert_eq!(visible + in_flight, 1, "the message stays on the queue");
    w.stop().await;
}

/// #41 item 1: a pointer into a bucket `--s3-bucket` does not list is poison with a reason naming the
/// bucket and the setting, before any S3 call: the object (team-b's) is neither read nor, with
/// `--s3-delete-after`, deleted, and no request naming that bucket reaches S3 (a counting forwarder in
/// front of moto's S3 sees only the allowed bucket's fetch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pointer_into_a_bucket_not_listed_is_poison_before_any_s3_call() {
    let q = TestQueue::new("s3-confused", 30, 3, false).await;
    let s3 = s3().await;
    let ours = bucket(&s3).await;
    let theirs = bucket(&s3).await;
    for (b, body) in [(&ours, "ours"), (&theirs, "payroll of team b")] {
        s3.put_object()
            .bucket(b)
            .key("p.csv")
            .body(body.as_bytes().to_vec().into())
            .send()
            .await
            .unwrap();
    }
    send_pointer(&q, &theirs, "p.csv", 17).await;
    send_pointer(&q, &ours, "p.csv", 4).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    // The worker's SQS and S3 calls through a forwarder that keeps what it sends.
    let proxy = common::counting_proxy(&common::sqs_endpoint()).await;
    let mut w = Worker::start(&q.args_via(
        &proxy.endpoint,
        &[
            "--http-url",
            &h.url,
            "--s3-payloads",
            "--s3-delete-after",
            "--s3-bucket",
            // A pattern: the listed names are globs.
            &format!("{}*", &ours[..ours.len() - 2]),
        ],
    ));
    eventually(SECS(30), "one handled, one dead-lettered", || async {
        q.dlq_visible().await == 1 && h.calls().len() == 1
    })
    .await;
    assert_eq!(h.calls()[0].body, b"ours");
    let got = drain_dlq(&q).await;
    let reason = got[0]
        .1
        .get("qc-poison-reason")
        .cloned()
        .unwrap_or_default();
    assert!(
        reason.contains(&theirs) && reason.contains("handler.s3Payloads.buckets"),
        "{reason}"
    );
    // S3 requests name the bucket first in the path (path-style, as against an emulator).
    let sent = proxy.sent();
    let s3_requests: Vec<&str> = ["GET /", "HEAD /", "DELETE /", "PUT /"]
        .iter()
        .flat_map(|m| sent.match_indices(m))
        .map(|(at, m)| {
            let target = &sent[at + m.len() - 1..];
            &target[..target.find(' ').unwrap_or(target.len())]
        })
        .collect();
    assert!(
        s3_requests
            .iter()
            .any(|t| t.starts_with(&format!("/{ours}/p.csv?x-id=GetObject"))),
        "the allowed fetch went through the forwarder: {s3_requests:?}"
    );
    assert!(
        !s3_requests.iter().any(|l| l.contains(&theirs)),
        "no S3 request named the bucket not listed: {s3_requests:?}"
    );
    s3.head_object()
        .bucket(&theirs)
        .key("p.csv")
        .send()
        .await
        .expect("team b's object is still there");
    w.stop().await;
}

#[test]
fn s3_payloads_without_a_bucket_are_refused_at_start() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args([
            "--queue-url",
            "http://127.0.0.1:1/000000000000/q",
            "--http-url",
            "http://127.0.0.1:8080/",
            "--s3-payloads",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--s3-bucket") && err.contains("required"),
        "{err}"
    );
}

/// A moto of the test's own that enforces IAM after its first six requests (two users and their keys
/// and policies): `worker` may use any queue but read objects of one bucket only, `admin` anything.
struct IamS3 {
    endpoint: String,
    worker: (String, String),
    admin: (String, String),
    _moto: common::OwnMoto,
}

impl IamS3 {
    fn start(readable: &str) -> IamS3 {
        let moto = common::OwnMoto::start(&[], &[("INITIAL_NO_AUTH_ACTION_COUNT", "6")]);
        let endpoint = format!("http://127.0.0.1:{}", moto.port);
        let setup = |params: &[(&str, &str)]| {
            let mut cmd = std::process::Command::new("curl");
            cmd.args(["-sS", "--fail-with-body", "--aws-sigv4"])
                .arg("aws:amz:us-east-1:iam")
                .args(["--user", "testing:testing"]);
            cmd.arg("--data-urlencode").arg("Version=2010-05-08");
            for (k, v) in params {
                cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
            }
            let out = cmd.arg(format!("{endpoint}/")).output().expect("curl runs");
            let body = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(out.status.success(), "{params:?}: {body}");
            body
        };
        let between = |xml: &str, tag: &str| -> String {
            let start = xml.find(&format!("<{tag}>")).unwrap() + tag.len() + 2;
            xml[start..start + xml[start..].find('<').unwrap()].to_string()
        };
        let user = |name: &str, policy: serde_json::Value| {
            setup(&[("Action", "CreateUser"), ("UserName", name)]);
            let xml = setup(&[("Action", "CreateAccessKey"), ("UserName", name)]);
            setup(&[
                ("Action", "PutUserPolicy"),
                ("UserName", name),
                ("PolicyName", "p"),
                ("PolicyDocument", &policy.to_string()),
            ]);
            (
                between(&xml, "AccessKeyId"),
                between(&xml, "SecretAccessKey"),
            )
        };
        let worker = user(
            "worker",
            serde_json::json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "sqs:*", "Resource": "*"},
                {"Effect": "Allow", "Action": ["s3:GetObject", "s3:DeleteObject"],
                 "Resource": [format!("arn:aws:s3:::{readable}/*"),
                              // So that S3 answers NoSuchBucket, not AccessDenied, for it.
                              "arn:aws:s3:::qc-no-such-bucket-anywhere/*".to_string()]}]}),
        );
        let admin = user(
            "admin",
            serde_json::json!({"Version": "2012-10-17", "Statement": [
                {"Effect": "Allow", "Action": "*", "Resource": "*"}]}),
        );
        IamS3 {
            endpoint,
            worker,
            admin,
            _moto: moto,
        }
    }

    async fn admin_conf(&self) -> aws_types::SdkConfig {
        aws_config::defaults(aws_config::BehaviorVersion::latest())
            .region(aws_config::Region::new("us-east-1"))
            .endpoint_url(&self.endpoint)
            .http_client(qc::aws::http_client())
            .credentials_provider(aws_credential_types::Credentials::new(
                &self.admin.0,
                &self.admin.1,
                None,
                None,
                "test",
            ))
            .load()
            .await
    }
}

/// #41 item 1: where IAM refuses the object (AccessDenied from a moto that enforces IAM), the message
/// is poison with S3's reason, never a breaker failure: ten refused pointers among twenty plain messages
/// leave the breaker closed (no transition at all), the plain ones are handled and the refused ones are
/// in the DLQ. A missing bucket (NoSuchBucket) is poison too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_denied_and_no_such_bucket_are_poison_never_breaker_failures() {
    let readable = common::unique_name("readable").to_lowercase();
    let denied = common::unique_name("denied").to_lowercase();
    let iam = IamS3::start(&readable);
    let conf = iam.admin_conf().await;
    let s3 = aws_sdk_s3::Client::from_conf(
        aws_sdk_s3::config::Builder::from(&conf)
            .force_path_style(true)
            .build(),
    );
    for b in [&readable, &denied] {
        s3.create_bucket().bucket(b).send().await.unwrap();
    }
    s3.put_object()
        .bucket(&denied)
        .key("secret.csv")
        .body(b"no".to_vec().into())
        .send()
        .await
        .unwrap();
    let q = TestQueue::on(aws_sdk_sqs::Client::new(&conf), "s3-denied", 30, 5, false).await;
    for _ in 0..10 {
        send_pointer(&q, &denied, "secret.csv", 2).await;
    }
    send_pointer(&q, "qc-no-such-bucket-anywhere", "k", 2).await;
    let plain: Vec<String> = (0..20).map(|i| format!("plain-{i}")).collect();
    q.send_all(&plain, |_| String::new()).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start_with_env(
        std::sync::Arc::new(tempfile::tempdir().unwrap()),
        &q.args_via(
            &iam.endpoint,
            &[
                "--http-url",
                &h.url,
                "--concurrency",
                "2",
                "--breaker-consecutive",
                "3",
                "--s3-payloads",
                "--s3-bucket",
                &readable,
                "--s3-bucket",
                &denied,
                "--s3-bucket",
                "qc-no-such-bucket-*",
            ],
        ),
        &[
            ("AWS_ACCESS_KEY_ID", &iam.worker.0),
            ("AWS_SECRET_ACCESS_KEY", &iam.worker.1),
        ],
    );
    eventually(
        SECS(60),
        "plain handled, pointers dead-lettered",
        || async { h.calls().len() == 20 && q.dlq_visible().await == 11 },
    )
    .await;
    h.assert_each_handled_once(&plain);
    let got = drain_dlq(&q).await;
    let reasons: Vec<String> = got
        .iter()
        .map(|(_, a, _)| a.get("qc-poison-reason").cloned().unwrap_or_default())
        .collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.contains("AccessDenied"))
            .count(),
        10,
        "{reasons:?}"
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| r.contains("NoSuchBucket"))
            .count(),
        1,
        "{reasons:?}"
    );
    let opened = w
        .metric("qc_worker_breaker_transitions_total{to=\"open\"}")
        .await
        .unwrap_or(0.0);
    assert!(opened < 0.5, "the breaker never opened on S3's refusals");
    w.stop().await;
}

/// Peak resident memory of a process (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kib / 1024.0
}

/// #40 item 5: payload bytes in flight stay within `--s3-payload-budget`. Eight 16 MiB payloads at
/// concurrency 8 under a 40 MiB budget: at most two are held (handled) at once, the others wait (no
/// poison, no retry), each is handled once, and the worker's peak resident memory stays far below the
/// 128 MiB the eight would take together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payloads_past_the_memory_budget_wait_and_the_worker_stays_within_it() {
    const MIB: usize = 1024 * 1024;
    let q = TestQueue::new("s3-budget", 60, 3, false).await;
    let s3 = s3().await;
    let b = bucket(&s3).await;
    for i in 0..8 {
        let body: Vec<u8> = (0..16 * MIB).map(|j| b'a' + ((i + j) % 26) as u8).collect();
        s3.put_object()
            .bucket(&b)
            .key(format!("big/{i}"))
            .body(body.into())
            .send()
            .await
            .unwrap();
        send_pointer(&q, &b, &format!("big/{i}"), 16 * MIB).await;
    }
    let h = HttpHandler::start(|_| Reply::ok(Duration::from_millis(400))).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--concurrency",
        "8",
        "--s3-payloads",
        "--s3-bucket",
        &b,
        "--s3-payload-budget",
        "40MiB",
    ]));
    eventually(SECS(90), "all eight handled", || async {
        h.calls().len() >= 8 && q.is_empty().await
    })
    .await;
    let calls = h.calls();
    assert_eq!(calls.len(), 8, "each once");
    assert!(calls.iter().all(|c| c.body.len() == 16 * MIB));
    assert!(
        h.max_active() <= 2,
        "{} payloads held at once",
        h.max_active()
    );
    let peak = peak_rss_mib(w.pid());
    eprintln!("peak resident {peak:.1} MiB");
    assert!(peak < 100.0, "peak resident {peak:.1} MiB");
    let failed = w
        .metric("qc_worker_messages_processed_total{outcome=\"transient\"}")
        .await
        .unwrap_or(0.0);
    assert!(
        failed < 0.5,
        "waiting for the budget is no failure: {failed}"
    );
    w.stop().await;
}

/// #40 item 5: a second delivery of a message whose object this worker deleted after handling the
/// first (`--s3-delete-after`) is a duplicate: deleted without a handler call, never poison; a pointer
/// at an object that never existed stays poison.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_whose_object_this_worker_deleted_is_a_duplicate_not_poison() {
    let q = TestQueue::new("s3-dup", 30, 3, false).await;
    let s3 = s3().await;
    let b = bucket(&s3).await;
    s3.put_object()
        .bucket(&b)
        .key("once.json")
        .body(b"{\"n\":1}".to_vec().into())
        .send()
        .await
        .unwrap();
    send_pointer(&q, &b, "once.json", 7).await;
    send_pointer(&q, &b, "once.json", 7).await;
    let h = HttpHandler::start(|_| Reply::ok(Duration::ZERO)).await;
    let mut w = Worker::start(&q.args(&[
        "--http-url",
        &h.url,
        "--concurrency",
        "1",
        "--s3-payloads",
        "--s3-bucket",
        &b,
        "--s3-delete-after",
    ]));
    eventually(SECS(30), "both gone from the queue", || q.is_empty()).await;
    assert_eq!(h.calls().len(), 1, "the copy is not handled again");
    assert_eq!(q.dlq_visible().await, 0, "and not dead-lettered");
    assert_eq!(
        w.metric("qc_worker_messages_processed_total{outcome=\"duplicate\"}")
            .await,
        Some(1.0)
    );
    send_pointer(&q, &b, "never-was.json", 7).await;
    eventually(SECS(30), "a pointer at nothing is still poison", || async {
        q.dlq_visible().await == 1
    })
    .await;
    w.stop().await;
}
