//! Tenancy (#28): what one QueueConsumer's AWS calls may reach and what it may learn about another's
//! queues, against the in-memory Kubernetes API and moto through the real SDK provider.

mod common;
mod fake_kube;

use std::sync::Arc;

use common::fixture::consumer;
use fake_kube::aws::TEST_WORKER_IMAGE;
use fake_kube::{DEPLOYMENTS, EVENTS, FakeKube, QUEUE_CONSUMERS};
use kube::runtime::controller::Action;
use qc::api::QueueConsumer;
use qc::aws::endpoints::AllowedEndpoints;
use qc::controller::observe::SdkProvider;
use qc::controller::{Context, reconcile};
use qc::render::RenderOptions;
use qc::tenancy::TenancyPolicy;
use serde_json::{Value, json};

const NS: &str = "team-a";

/// A controller context with the real SDK provider (clients per region and endpoint) and moto's
/// endpoint allowed.
fn sdk_context(fake: &FakeKube) -> Arc<Context> {
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(SdkProvider::default()),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        None,
    );
    ctx.endpoints = AllowedEndpoints::parse([common::sqs_endpoint()]).unwrap();
    Arc::new(ctx)
}

async fn sqs_in(region: &str) -> aws_sdk_sqs::Client {
    let conf = qc::aws::sdk_config(Some(region), Some(&common::sqs_endpoint())).await;
    aws_sdk_sqs::Client::new(&conf)
}

fn manifest(name: &str, url: &str, region: &str) -> Value {
    consumer(name)
        .namespace(NS)
        .on_moto(url)
        .set("/spec/queue/region", region)
        .timeout("10s")
        .wait_time("1s")
        .image("team-a/orders:1")
        .alarm(false)
        // Long enough that both reconciles fall in one interval: the cache would hand the second
        // the first one's read if it took the two for one queue.
        .scaling(json!({"pollInterval": "5m"}))
        .json()
}

fn qc(fake: &FakeKube, name: &str) -> QueueConsumer {
    serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap()
}

/// Behind an endpoint that serves several regions (moto, LocalStack) one URL names a queue per region.
/// Two QueueConsumers with that URL and two regions read two queues: before, the facts cache was
/// keyed by endpoint and URL, and the second took the first one's counts.
#[tokio::test]
async fn one_url_in_two_regions_is_two_queues_and_never_shares_counts() {
    let name = common::unique_name("orders");
    let east = common::create_queue(&sqs_in("us-east-1").await, &name, &[]).await;
    let west_client = sqs_in("eu-west-1").await;
    let west = common::create_queue(&west_client, &name, &[]).await;
    assert_eq!(east, west, "moto names both queues by one URL");
    common::send_numbered(&west_client, &west, "m", 3).await;

    let fake = FakeKube::new();
    let ctx = sdk_context(&fake);
    fake.create(QUEUE_CONSUMERS, manifest("east", &east, "us-east-1"));
    fake.create(QUEUE_CONSUMERS, manifest("west", &west, "eu-west-1"));
    for n in ["east", "west"] {
        reconcile(Arc::new(qc(&fake, n)), ctx.clone())
            .await
            .unwrap();
    }
    let visible = |n| qc(&fake, n).status.unwrap().queue.unwrap().visible;
    assert_eq!(visible("east"), Some(0), "us-east-1's queue is empty");
    assert_eq!(
        visible("west"),
        Some(3),
        "eu-west-1's queue holds three, whatever us-east-1's read said"
    );
}

/// The multi-tenant preset of the chart's values: every namespace names its own queues, through a role
/// of its own; `ops` may name any queue of the account without a role; nobody else is in the policy.
const POLICY: &str = r#"
rules:
  - namespaces: [ops]
    accounts: ["123456789012"]
  - namespaces: ["team-*"]
    requireRoleArn: true
    roleArns: ["arn:aws:iam::123456789012:role/qc-{namespace}_*"]
    queues: ["arn:aws:sqs:*:123456789012:{namespace}_*"]
    buckets: ["{namespace}.*"]
    alarmActions: ["arn:aws:sns:*:123456789012:{namespace}_*"]
"#;

fn policy_context(fake: &FakeKube, allowed: &[&str]) -> Arc<Context> {
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(SdkProvider::default()),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        None,
    );
    ctx.endpoints = AllowedEndpoints::parse(allowed).unwrap();
    ctx.tenancy = TenancyPolicy::parse(POLICY).unwrap();
    Arc::new(ctx)
}

fn qc_in(fake: &FakeKube, ns: &str, name: &str) -> QueueConsumer {
    serde_json::from_value(fake.get(QUEUE_CONSUMERS, ns, name).unwrap()).unwrap()
}

/// (namespace, name, queue, roleArn, the refusal's reason or None)
type Row<'a> = (&'a str, &'a str, &'a str, Option<String>, Option<&'a str>);

/// A QueueConsumer the tenancy policy refuses gets Ready=False with the refusal's reason, ConfigValid
/// naming the rule and the fix, a Warning Event, no Deployment, no finalizer and no AWS call: its
/// endpoint (a counting forwarder to moto) sees no connection, while an allowed one beside it, through
/// a forwarder of its own, reaches moto.
#[tokio::test]
async fn a_consumer_outside_its_namespace_policy_never_reaches_aws() {
    let sqs = sqs_in("us-east-1").await;
    let own = common::create_queue(&sqs, &common::unique_name("team-a_orders"), &[]).await;
    let other = common::create_queue(&sqs, &common::unique_name("team-b_orders"), &[]).await;
    // #41 item 2: namespace team-a-staging's queue; the old preset's `{namespace}-*` let team-a name it.
    let staging =
        common::create_queue(&sqs, &common::unique_name("team-a-staging_orders"), &[]).await;
    let fake = FakeKube::new();
    let role = |ns: &str| format!("arn:aws:iam::123456789012:role/qc-{ns}_orders");
    let rows: [Row<'_>; 9] = [
        (
            "team-a",
            "other-topic",
            &own,
            Some(role("team-a")),
            Some("AlarmActionNotAllowed"),
        ),
        ("team-a", "allowed", &own, Some(role("team-a")), None),
        (
            "team-a",
            "longer-namespaces-queue",
            &staging,
            Some(role("team-a")),
            Some("QueueNotAllowed"),
        ),
        (
            "team-a",
            "other-bucket",
            &own,
            Some(role("team-a")),
            Some("BucketNotAllowed"),
        ),
        (
            "team-a",
            "other-queue",
            &other,
            Some(role("team-a")),
            Some("QueueNotAllowed"),
        ),
        ("team-a", "no-role", &own, None, Some("RoleArnRequired")),
        (
            "team-a",
            "other-role",
            &own,
            Some(role("team-b")),
            Some("RoleArnNotAllowed"),
        ),
        (
            "team-c",
            "another-teams-queue",
            &other,
            Some(role("team-c")),
            Some("QueueNotAllowed"),
        ),
        ("qa", "no-rule", &own, None, Some("NamespaceNotInPolicy")),
    ];
    let mut proxies = Vec::new();
    for _ in &rows {
        proxies.push(common::counting_proxy(&common::sqs_endpoint()).await);
    }
    let allowed: Vec<&str> = proxies.iter().map(|p| p.endpoint.as_str()).collect();
    let ctx = policy_context(&fake, &allowed);
    for ((ns, name, url, role, _), proxy) in rows.iter().zip(&proxies) {
        let mut m = consumer(name)
            .namespace(ns)
            .queue_url(url)
            .endpoint(&proxy.endpoint)
            .set("/spec/queue/region", "us-east-1")
            .timeout("10s")
            .wait_time("1s")
            .image("team/orders:1")
            .alarm(true);
        if let Some(r) = role {
            m = m.set("/spec/aws/roleArn", r.as_str());
        }
        // #41 item 1: S3 payloads from the namespace's own buckets, or (one row) another's.
        let bucket = if *name == "other-bucket" {
            "team-b.payloads"
        } else {
            "{namespace}.payloads"
        };
        m = m.set(
            "/spec/handler/s3Payloads",
            json!({"enabled": true, "buckets": [bucket]}),
        );
        // #41 item 5: the DLQ alarm notifying namespace team-a-staging's topic.
        if *name == "other-topic" {
            m = m.set(
                "/spec/deadLetter/alarmActions",
                json!(["arn:aws:sns:us-east-1:123456789012:team-a-staging_alerts"]),
            );
        }
        fake.create(QUEUE_CONSUMERS, m.json());
    }
    for ((ns, name, _, _, refused), proxy) in rows.iter().zip(&proxies) {
        let action = reconcile(Arc::new(qc_in(&fake, ns, name)), ctx.clone()).await;
        let q = qc_in(&fake, ns, name);
        let ready = fake_kube::condition_of(q.clone(), "Ready");
        let Some(reason) = refused else {
            assert_ne!(action.unwrap(), Action::await_change(), "{name}");
            assert_eq!(
                fake_kube::condition_of(q, "QueueReachable").status,
                "True",
                "{name}"
            );
            assert!(
                proxy.count() > 0,
                "{name}: the allowed consumer reached moto"
            );
            assert!(
                fake.get(DEPLOYMENTS, ns, name).is_some(),
                "{name}: rolled out"
            );
            continue;
        };
        assert_eq!(
            action.unwrap(),
            Action::await_change(),
            "{name}: only a change of the spec or the policy helps"
        );
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", *reason),
            "{name}: {}",
            ready.message
        );
        let valid = fake_kube::condition_of(q.clone(), "ConfigValid");
        assert_eq!(
            (valid.status.as_str(), valid.reason.as_str()),
            ("False", *reason),
            "{name}"
        );
        assert!(
            valid.message.contains("tenancy") && valid.message.contains("no AWS call is made"),
            "{name}: names the policy and what it does: {}",
            valid.message
        );
        assert_eq!(
            fake_kube::condition_of(q.clone(), "QueueReachable").status,
            "Unknown",
            "{name}"
        );
        assert!(
            q.metadata.finalizers.is_none(),
            "{name}: no alarm, no finalizer"
        );
        assert!(
            fake.get(DEPLOYMENTS, ns, name).is_none(),
            "{name}: nothing rolled out"
        );
        let events: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST" && r.targets(EVENTS))
            .filter_map(|r| r.body)
            .filter(|b| b["regarding"]["name"] == *name || b["involvedObject"]["name"] == *name)
            .collect();
        assert!(
            events
                .iter()
                .any(|e| e["reason"] == *reason && e["type"] == "Warning"),
            "{name}: a Warning Event {reason}: {events:?}"
        );
        assert_eq!(proxy.count(), 0, "{name}: no connection to its endpoint");
    }
    // Nor later: nothing in the background (the CloudWatch refresher) reads for them.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    for ((_, name, _, _, refused), proxy) in rows.iter().zip(&proxies) {
        if refused.is_some() {
            assert_eq!(proxy.count(), 0, "{name}: still nothing, later");
        }
    }
}

/// `spec.aws.roleArn`: the controller assumes the role (the SDK's AssumeRoleProvider, session
/// `qc-NAMESPACE.NAME`, ExternalId `qc:NAMESPACE`) and signs every other call for that QueueConsumer —
/// queue, DLQ, CloudWatch — with the role's credentials; only AssumeRole itself goes out as the
/// controller. A QueueConsumer of the same queue without a role reads it as the controller, on its own:
/// the role is part of the facts cache's key, so neither is handed the other's read.
#[tokio::test]
async fn a_consumer_with_a_role_makes_every_call_as_that_role() {
    use aws_sdk_sqs::types::QueueAttributeName;
    let sqs = sqs_in("us-east-1").await;
    let dlq = common::create_queue(&sqs, &common::unique_name("team-a_dlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    let url = common::create_queue(
        &sqs,
        &common::unique_name("team-a_orders"),
        &[(
            QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )],
    )
    .await;
    let (with_role, own) = (
        common::counting_proxy(&common::sqs_endpoint()).await,
        common::counting_proxy(&common::sqs_endpoint()).await,
    );
    let fake = FakeKube::new();
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(SdkProvider::default()),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        None,
    );
    ctx.endpoints =
        AllowedEndpoints::parse([with_role.endpoint.as_str(), own.endpoint.as_str()]).unwrap();
    let ctx = Arc::new(ctx);
    let role = "arn:aws:iam::123456789012:role/qc-team-a_orders";
    for (name, proxy, arn) in [("orders", &with_role, Some(role)), ("plain", &own, None)] {
        let mut m = consumer(name)
            .namespace(NS)
            .queue_url(&url)
            .endpoint(&proxy.endpoint)
            .set("/spec/queue/region", "us-east-1")
            .timeout("10s")
            .wait_time("1s")
            .image("team-a/orders:1")
            .alarm(true)
            .scaling(json!({"pollInterval": "5m"}));
        if let Some(arn) = arn {
            m = m.set("/spec/aws/roleArn", arn);
        }
        fake.create(QUEUE_CONSUMERS, m.json());
        reconcile(Arc::new(qc(&fake, name)), ctx.clone())
            .await
            .unwrap();
        let q = qc(&fake, name);
        assert_eq!(
            fake_kube::condition_of(q.clone(), "QueueReachable").status,
            "True",
            "{name}"
        );
    }
    // The alarm's CloudWatch calls run in the background.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let sent = with_role.sent();
    let assume = sent.matches("Action=AssumeRole").count();
    let as_controller = sent.matches("Credential=testing/").count();
    let signed = sent.matches("Credential=").count();
    assert!(assume >= 1, "the role was assumed:\n{sent}");
    assert!(sent.contains("RoleArn=arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fqc-team-a_orders"));
    assert!(sent.contains("RoleSessionName=qc-team-a.orders"), "{sent}");
    assert!(sent.contains("ExternalId=qc%3Ateam-a"), "{sent}");
    assert!(
        sent.contains("AmazonSQS.GetQueueAttributes") && sent.contains("Action=DescribeAlarms"),
        "queue, DLQ and alarm calls went through: {sent}"
    );
    assert_eq!(
        as_controller,
        assume,
        "only AssumeRole is signed as the controller; the other {} calls as the role",
        signed - as_controller
    );
    assert!(signed > assume);

    let plain = own.sent();
    assert!(!plain.contains("AssumeRole"), "no role, no AssumeRole");
    assert!(
        plain.contains("AmazonSQS.GetQueueAttributes"),
        "read on its own, not handed the role's read"
    );
    assert_eq!(
        plain.matches("Credential=testing/").count(),
        plain.matches("Credential=").count(),
        "everything as the controller"
    );
}

/// A clock the test moves: the SDK's time source, which its credentials cache decides expiry by.
#[derive(Debug, Clone)]
struct Clock(Arc<std::sync::Mutex<std::time::SystemTime>>);

impl aws_types::sdk_config::TimeSource for Clock {
    fn now(&self) -> std::time::SystemTime {
        *self.0.lock().unwrap()
    }
}

/// The role's credentials (`qc::aws::identity::assume`, the SDK's AssumeRoleProvider behind its
/// credentials cache) are fetched once and reused, and fetched again once they expire: moto's sessions
/// last an hour, the SDK's clock is moved two.
#[tokio::test]
async fn role_credentials_are_cached_and_assumed_again_past_their_expiry() {
    let sqs = sqs_in("us-east-1").await;
    let url = common::create_queue(&sqs, &common::unique_name("team-a_orders"), &[]).await;
    let proxy = common::counting_proxy(&common::sqs_endpoint()).await;
    let clock = Clock(Arc::new(
        std::sync::Mutex::new(std::time::SystemTime::now()),
    ));
    let conf = qc::aws::controller_sdk_config(Some("us-east-1"), Some(&proxy.endpoint))
        .await
        .into_builder()
        .time_source(clock.clone())
        .build();
    let role = qc::aws::identity::Role::for_consumer(
        "arn:aws:iam::123456789012:role/qc-team-a_orders",
        NS,
        "orders",
    );
    let client = aws_sdk_sqs::Client::new(&qc::aws::identity::assume(conf, &role).await);
    let read = || async {
        client
            .get_queue_attributes()
            .queue_url(&url)
            .send()
            .await
            .unwrap();
    };
    let assumed = || proxy.sent().matches("Action=AssumeRole").count();
    for _ in 0..3 {
        read().await;
    }
    assert_eq!(assumed(), 1, "assumed once, then cached");
    // Two hours on, the session has expired: the next call assumes the role again.
    let now = *clock.0.lock().unwrap();
    *clock.0.lock().unwrap() = now + std::time::Duration::from_hours(2);
    read().await;
    assert_eq!(assumed(), 2, "assumed again once the session expired");
    // moto dates sessions by the wall clock: back at it, the new session is fresh and reused.
    *clock.0.lock().unwrap() = std::time::SystemTime::now();
    read().await;
    assert_eq!(assumed(), 2, "the new session is reused");
    assert_eq!(
        proxy.sent().matches("AmazonSQS.GetQueueAttributes").count(),
        5,
        "every read went out"
    );
}

/// The DLQ a queue's redrive policy names is read, alarmed on and redriven from only when the
/// namespace's rule allows it as it allows the queue: team-a's queue dead-lettering into team-b's
/// queue gets DeadLetterQueueHealthy=Unknown naming the rule, no alarm, and no call about that DLQ
/// (no GetQueueUrl); the same queue with a DLQ of its own is read as usual.
#[tokio::test]
async fn a_dead_letter_queue_outside_the_namespace_policy_is_never_read() {
    use aws_sdk_sqs::types::QueueAttributeName;
    let sqs = sqs_in("us-east-1").await;
    let fake = FakeKube::new();
    let mut proxies = Vec::new();
    let mut urls = Vec::new();
    for dlq_prefix in ["team-b_dlq", "team-a_dlq"] {
        let dlq = common::create_queue(&sqs, &common::unique_name(dlq_prefix), &[]).await;
        let arn = common::queue_arn(&sqs, &dlq).await;
        urls.push(
            common::create_queue(
                &sqs,
                &common::unique_name("team-a_orders"),
                &[(
                    QueueAttributeName::RedrivePolicy,
                    json!({"deadLetterTargetArn": arn, "maxReceiveCount": 5}).to_string(),
                )],
            )
            .await,
        );
        proxies.push(common::counting_proxy(&common::sqs_endpoint()).await);
    }
    let allowed: Vec<&str> = proxies.iter().map(|p| p.endpoint.as_str()).collect();
    let ctx = policy_context(&fake, &allowed);
    for ((name, url), proxy) in ["foreign-dlq", "own-dlq"].iter().zip(&urls).zip(&proxies) {
        let m = consumer(name)
            .namespace(NS)
            .queue_url(url)
            .endpoint(&proxy.endpoint)
            .set("/spec/queue/region", "us-east-1")
            .set(
                "/spec/aws/roleArn",
                "arn:aws:iam::123456789012:role/qc-team-a_orders",
            )
            .timeout("10s")
            .wait_time("1s")
            .image("team-a/orders:1")
            .alarm(true);
        fake.create(QUEUE_CONSUMERS, m.json());
        reconcile(Arc::new(qc(&fake, name)), ctx.clone())
            .await
            .unwrap();
    }
    let q = qc(&fake, "foreign-dlq");
    assert_eq!(
        fake_kube::condition_of(q.clone(), "QueueReachable").status,
        "True"
    );
    let dlq = fake_kube::condition_of(q.clone(), "DeadLetterQueueHealthy");
    assert_eq!(dlq.status, "Unknown", "{dlq:?}");
    assert!(
        dlq.message.contains("team-b_dlq") && dlq.message.contains("does not allow"),
        "names the DLQ and the policy: {}",
        dlq.message
    );
    assert!(
        q.metadata.finalizers.is_none(),
        "no alarm on a DLQ the policy refuses"
    );
    assert!(
        !proxies[0].sent().contains("AmazonSQS.GetQueueUrl"),
        "the refused DLQ's URL was never asked for"
    );
    let own = qc(&fake, "own-dlq");
    assert_eq!(
        fake_kube::condition_of(own.clone(), "DeadLetterQueueHealthy").status,
        "True"
    );
    assert!(proxies[1].sent().contains("AmazonSQS.GetQueueUrl"));
    assert!(own.metadata.finalizers.is_some(), "its alarm is kept");
}

/// #40 item 5: `deleteAfterProcessing` beside `unwrapSns` is refused by the controller: ConfigValid
/// False with the finding naming the field and the fix, and the rendered worker does not delete
/// payloads (it would refuse the two flags together).
#[tokio::test]
async fn s3_payload_delete_with_unwrap_sns_is_config_invalid_and_never_rendered() {
    let sqs = sqs_in("us-east-1").await;
    let url = common::create_queue(&sqs, &common::unique_name("team-a_fanout"), &[]).await;
    let fake = FakeKube::new();
    let ctx = sdk_context(&fake);
    let mut m = manifest("fanout", &url, "us-east-1");
    m["spec"]["handler"]["unwrapSns"] = json!("on");
    m["spec"]["handler"]["s3Payloads"] = json!({"enabled": true, "deleteAfterProcessing": true, "buckets": ["{namespace}.payloads"]});
    fake.create(QUEUE_CONSUMERS, m);
    let _ = reconcile(Arc::new(qc(&fake, "fanout")), ctx.clone()).await;
    let q = qc(&fake, "fanout");
    let valid = fake_kube::condition_of(q.clone(), "ConfigValid");
    assert_eq!(
        (valid.status.as_str(), valid.reason.as_str()),
        ("False", "S3PayloadDeleteWithSns"),
        "{}",
        valid.message
    );
    let f = q
        .status
        .unwrap()
        .findings
        .into_iter()
        .find(|f| f.code == "S3PayloadDeleteWithSns")
        .expect("the finding");
    assert!(
        f.message
            .contains("handler.s3Payloads.deleteAfterProcessing")
            && f.recommendation
                .contains("set handler.s3Payloads.deleteAfterProcessing to false"),
        "{f:?}"
    );
    let d = fake
        .get(DEPLOYMENTS, NS, "fanout")
        .expect("rolled out (enforce is off)");
    let args = d.to_string();
    assert!(
        args.contains("--s3-payloads") && args.contains("team-a.payloads"),
        "{args}"
    );
    assert!(!args.contains("--s3-delete-after"), "{args}");
}

/// Account B of the cross-account test: the queue's, the DLQ's and the alarm's (the controller, the
/// worker and moto's default credentials are account A, 123456789012).
const ACCOUNT_B: &str = "210987654321";

/// An SDK config signed as `role`, assumed with ExternalId `qc:team-a`: moto hands AssumeRole's
/// credentials to the role's account, so these are account B's own clients.
async fn assumed(role: &str) -> aws_types::SdkConfig {
    let base = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    let c = aws_sdk_sts::Client::new(&base)
        .assume_role()
        .role_arn(role)
        .role_session_name("qc-test-setup")
        .external_id("qc:team-a")
        .send()
        .await
        .unwrap()
        .credentials
        .unwrap();
    base.into_builder()
        .credentials_provider(
            aws_credential_types::provider::SharedCredentialsProvider::new(
                aws_credential_types::Credentials::new(
                    c.access_key_id(),
                    c.secret_access_key(),
                    Some(c.session_token().to_string()),
                    None,
                    "test",
                ),
            ),
        )
        .build()
}

/// A queue named `name` with a DLQ named `dlq` (maxReceiveCount 5) holding `visible` and `dead`
/// messages: (queue URL, DLQ URL).
async fn queue_with_dlq(
    sqs: &aws_sdk_sqs::Client,
    name: &str,
    dlq: &str,
    visible: usize,
    dead: usize,
) -> (String, String) {
    use aws_sdk_sqs::types::QueueAttributeName;
    let dlq_url = common::create_queue(sqs, dlq, &[]).await;
    let dlq_arn = common::queue_arn(sqs, &dlq_url).await;
    let url = common::create_queue(
        sqs,
        name,
        &[(
            QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )],
    )
    .await;
    common::send_numbered(sqs, &url, "m", visible).await;
    common::send_numbered(sqs, &dlq_url, "d", dead).await;
    (url, dlq_url)
}

async fn alarms_named(conf: &aws_types::SdkConfig, name: &str) -> usize {
    aws_sdk_cloudwatch::Client::new(conf)
        .describe_alarms()
        .alarm_names(name)
        .send()
        .await
        .unwrap()
        .metric_alarms
        .unwrap_or_default()
        .len()
}

/// #41 item 7 (and item 5's second half): cross-account end to end on moto with two accounts. The
/// controller and the worker run as account A; team-a's queue, its DLQ and the alarm live in account B,
/// reached through `spec.aws.roleArn` (a role in B, ExternalId `qc:team-a`). Account A holds a queue
/// and a DLQ of the same names with other counts: every read, the alarm and the worker's receives must
/// land in B, never on A's namesakes. Beside it, under a policy that allows team-a only B's roles and
/// queues, A's same-named queue and a role in A are refused before any connection to the endpoint.
#[tokio::test]
async fn a_queue_in_another_account_is_read_alarmed_and_consumed_there_through_the_role() {
    let role = format!("arn:aws:iam::{ACCOUNT_B}:role/qc-team-a_orders");
    let in_b = assumed(&role).await;
    let (sqs_a, sqs_b) = (sqs_in("us-east-1").await, aws_sdk_sqs::Client::new(&in_b));
    let (name, dlq) = (
        common::unique_name("team-a_orders"),
        common::unique_name("team-a_dlq"),
    );
    let (url_a, _) = queue_with_dlq(&sqs_a, &name, &dlq, 5, 2).await;
    let (url_b, dlq_b) = queue_with_dlq(&sqs_b, &name, &dlq, 3, 1).await;
    assert!(url_b.contains(&format!("/{ACCOUNT_B}/")), "{url_b}");
    assert!(url_a.contains("/123456789012/"), "{url_a}");

    let fake = FakeKube::new();
    let proxies = [
        common::counting_proxy(&common::sqs_endpoint()).await,
        common::counting_proxy(&common::sqs_endpoint()).await,
        common::counting_proxy(&common::sqs_endpoint()).await,
    ];
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(SdkProvider::default()),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        None,
    );
    ctx.endpoints = AllowedEndpoints::parse(proxies.iter().map(|p| p.endpoint.as_str())).unwrap();
    ctx.tenancy = TenancyPolicy::parse(&format!(
        r#"
rules:
  - namespaces: [team-a]
    requireRoleArn: true
    roleArns: ["arn:aws:iam::{ACCOUNT_B}:role/qc-{{namespace}}_*"]
    queues: ["arn:aws:sqs:*:{ACCOUNT_B}:{{namespace}}_*"]
"#
    ))
    .unwrap();
    let ctx = Arc::new(ctx);
    let role_in_a = "arn:aws:iam::123456789012:role/qc-team-a_orders".to_string();
    let rows = [
        ("orders", &url_b, &role, None),
        ("namesake", &url_a, &role, Some("QueueNotAllowed")),
        ("role-in-a", &url_b, &role_in_a, Some("RoleArnNotAllowed")),
    ];
    for ((name, url, role, refused), proxy) in rows.iter().zip(&proxies) {
        fake.create(
            QUEUE_CONSUMERS,
            consumer(name)
                .namespace(NS)
                .queue_url(url)
                .endpoint(&proxy.endpoint)
                .set("/spec/queue/region", "us-east-1")
                .set("/spec/aws/roleArn", role.as_str())
                .timeout("10s")
                .wait_time("1s")
                .image("team-a/orders:1")
                .alarm(true)
                .scaling(json!({"pollInterval": "5m"}))
                .json(),
        );
        reconcile(Arc::new(qc(&fake, name)), ctx.clone())
            .await
            .unwrap();
        let q = qc(&fake, name);
        if let Some(reason) = refused {
            let valid = fake_kube::condition_of(q, "ConfigValid");
            assert_eq!(
                (valid.status.as_str(), valid.reason.as_str()),
                ("False", *reason),
                "{name}: {}",
                valid.message
            );
            assert!(
                valid.message.contains("no AWS call is made"),
                "{name}: {}",
                valid.message
            );
            assert_eq!(proxy.count(), 0, "{name}: no connection to its endpoint");
            continue;
        }
        assert_eq!(
            fake_kube::condition_of(q.clone(), "QueueReachable").status,
            "True",
            "{name}"
        );
        let status = q.status.unwrap();
        let queue = status.queue.unwrap();
        assert_eq!(
            queue.visible,
            Some(3),
            "B's queue read, not A's namesake (5)"
        );
        let dead = status.dead_letter.unwrap();
        // Through the consumer's endpoint (the counting forwarder): the same account and name.
        let path = |u: &str| u.splitn(4, '/').nth(3).map(str::to_string);
        assert_eq!(dead.url.as_deref().and_then(path), path(&dlq_b), "B's DLQ");
        assert_eq!(dead.visible, Some(1), "B's DLQ read, not A's namesake (2)");
    }

    // The alarm: in account B, none of its name in account A.
    let alarm = qc::controller::pipeline::alarm_name(&qc(&fake, "orders"));
    let base = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while alarms_named(&in_b, &alarm).await == 0 && std::time::Instant::now() < deadline {
        // The controller describes the alarm in the background and creates it at a later reconcile.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        reconcile(Arc::new(qc(&fake, "orders")), ctx.clone())
            .await
            .unwrap();
    }
    assert_eq!(alarms_named(&in_b, &alarm).await, 1, "the alarm is in B");
    assert_eq!(alarms_named(&base, &alarm).await, 0, "and not in A");

    // The worker, as account A with `--role-arn`, consumes B's 3 messages; A's 5 stay.
    let mut worker = std::process::Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args([
            "--queue-url",
            &url_b,
            "--endpoint-url",
            &common::sqs_endpoint(),
        ])
        .args(["--region", "us-east-1", "--role-arn", &role])
        .args(["--role-session-name", "qc-team-a.orders"])
        .args(["--role-external-id", "qc:team-a"])
        .args(["--wait-time", "1s", "--metrics-addr", "127.0.0.1:0"])
        .args(["--exec", "--", "true"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let left = |sqs: aws_sdk_sqs::Client, url: String| async move {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let a = sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(A::All)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap_or_default();
        let n = |k: A| a.get(&k).and_then(|v| v.parse::<u64>().ok()).unwrap();
        n(A::ApproximateNumberOfMessages) + n(A::ApproximateNumberOfMessagesNotVisible)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while left(sqs_b.clone(), url_b.clone()).await > 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    }
    let _ = worker.kill();
    let out = worker.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(left(sqs_b, url_b).await, 0, "B's queue consumed:\n{log}");
    assert_eq!(
        left(sqs_a, url_a).await,
        5,
        "A's namesake untouched:\n{log}"
    );
}
