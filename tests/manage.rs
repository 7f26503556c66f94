//! `spec.queue.manage` against moto through the reconcile (in-memory Kubernetes API): the queue's
//! settings raised to the rules' values and drift corrected, standard and FIFO queues created with
//! their DLQ wired, two QueueConsumers wanting other values left alone with a conflict, retention
//! never lowered, suspend and the tenancy policy touching nothing, and `check --live` as a dry run that
//! changes nothing.

mod common;
mod fake_kube;

use std::collections::HashMap;
use std::sync::Arc;

use aws_sdk_sqs::types::QueueAttributeName as A;
use common::fixture::moto_consumer;
use fake_kube::aws::{NoAlarms, TEST_WORKER_IMAGE};
use fake_kube::{EVENTS, FakeKube, QUEUE_CONSUMERS, Recorded};
use qc::api::QueueConsumer;
use qc::aws::SqsReader;
use qc::aws::endpoints::AllowedEndpoints;
use qc::aws::manage::{QueueWriter, SdkQueueWriter};
use qc::controller::observe::{AwsClients, AwsProvider, AwsTarget};
use qc::controller::{Context, reconcile};
use qc::render::RenderOptions;
use qc::tenancy::TenancyPolicy;
use serde_json::{Value, json};

const NS: &str = "shop";
const MANAGED: &str = "QueueManaged";

/// moto for every target, with a writer: what the operator's SDK provider gives a QueueConsumer.
struct MotoProvider {
    sqs: aws_sdk_sqs::Client,
    sts: aws_sdk_sts::Client,
}

#[async_trait::async_trait]
impl AwsProvider for MotoProvider {
    async fn clients(&self, _target: &AwsTarget) -> AwsClients {
        AwsClients {
            sqs: Arc::new(SqsReader::new(self.sqs.clone())),
            alarms: Arc::new(NoAlarms),
        }
    }

    async fn queue_writer(&self, _target: &AwsTarget) -> Option<Arc<dyn QueueWriter>> {
        Some(Arc::new(SdkQueueWriter::new(
            self.sqs.clone(),
            self.sts.clone(),
        )))
    }
}

/// An STS client of the same identity and endpoint as `sqs` (the writer's GetCallerIdentity): the
/// tests' SQS clients all use the environment's keys.
fn sts_of(sqs: &aws_sdk_sqs::Client) -> aws_sdk_sts::Client {
    let key = |k: &str| std::env::var(k).expect("scripts/test exports the AWS keys");
    let conf = aws_sdk_sts::Config::builder()
        .behavior_version(aws_sdk_sts::config::BehaviorVersion::latest())
        .region(sqs.config().region().cloned())
        .endpoint_url(common::sqs_endpoint())
        .http_client(qc::aws::http_client())
        .credentials_provider(aws_credential_types::Credentials::new(
            key("AWS_ACCESS_KEY_ID"),
            key("AWS_SECRET_ACCESS_KEY"),
            None,
            None,
            "test",
        ))
        .build();
    aws_sdk_sts::Client::from_conf(conf)
}

struct Env {
    fake: FakeKube,
    ctx: Arc<Context>,
    sqs: aws_sdk_sqs::Client,
}

fn env_with(sqs: aws_sdk_sqs::Client, tenancy: Option<&str>) -> Env {
    let fake = FakeKube::new();
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(MotoProvider {
            sqs: sqs.clone(),
            sts: sts_of(&sqs),
        }),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        Some("test".into()),
    );
    ctx.endpoints = AllowedEndpoints::parse(Some(common::sqs_endpoint())).expect("endpoint");
    if let Some(policy) = tenancy {
        ctx.tenancy = TenancyPolicy::parse(policy).expect("tenancy policy");
    }
    Env {
        fake,
        ctx: Arc::new(ctx),
        sqs,
    }
}

async fn env() -> Env {
    env_with(common::sqs_client().await, None)
}

/// p99 2s, timeout 10s, heartbeat off, concurrency 10: budget 7s, and timeout + margin = 15s, so the
/// rules ask for VisibilityTimeout 15s.
fn manifest(name: &str, url: &str, manage: &str) -> Value {
    moto_consumer(NS, url)
        .set("/metadata/name", name)
        .p99("2s")
        .set("/spec/processing/heartbeat", json!({"enabled": false}))
        .set("/spec/queue/manage", manage)
        .scaling(json!({"pollInterval": "1s", "minReplicas": 1}))
        .json()
}

impl Env {
    fn qc(&self, name: &str) -> QueueConsumer {
        serde_json::from_value(self.fake.get(QUEUE_CONSUMERS, NS, name).expect("consumer"))
            .expect("a QueueConsumer")
    }

    async fn reconcile(&self, name: &str) {
        reconcile(Arc::new(self.qc(name)), self.ctx.clone())
            .await
            .expect("reconcile");
    }

    fn condition(&self, name: &str) -> (String, String, String) {
        let c = fake_kube::condition_of(self.qc(name), MANAGED);
        (c.status, c.reason, c.message)
    }

    fn findings(&self, name: &str) -> Vec<String> {
        self.qc(name)
            .status
            .map(|s| s.findings.into_iter().map(|f| f.code).collect())
            .unwrap_or_default()
    }

    fn changes(&self, name: &str) -> Vec<(String, String, String)> {
        self.qc(name)
            .status
            .and_then(|s| s.managed)
            .map(|m| {
                m.last_changes
                    .into_iter()
                    .map(|c| (c.attribute, c.from, c.to))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn attrs(&self, url: &str) -> HashMap<String, String> {
        self.sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(A::All)
            .send()
            .await
            .expect("GetQueueAttributes")
            .attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k.as_str().to_string(), v))
            .collect()
    }

    async fn set(&self, url: &str, name: A, value: &str) {
        self.sqs
            .set_queue_attributes()
            .queue_url(url)
            .attributes(name, value)
            .send()
            .await
            .expect("SetQueueAttributes");
    }

    async fn next_poll(&self) {
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }
}

fn max_receive_count(attrs: &HashMap<String, String>) -> u32 {
    let policy = qc::aws::facts::parse_redrive_policy(&attrs["RedrivePolicy"]).expect("policy");
    policy.max_receive_count
}

fn event_notes(reqs: &[Recorded], reason: &str) -> Vec<String> {
    reqs.iter()
        .filter(|r| r.method == "POST" && r.targets(EVENTS))
        .filter_map(|r| {
            let body = r.body.as_ref()?;
            (body["reason"] == reason).then(|| body["note"].as_str().unwrap_or("").to_string())
        })
        .collect()
}

/// A DLQ (14 days) and a source queue with these attributes and a redrive policy of `r`.
async fn queue_with_dlq(sqs: &aws_sdk_sqs::Client, attrs: &[(A, &str)], r: u32) -> String {
    let dlq = common::create_queue(
        sqs,
        &common::unique_name("mdlq"),
        &[(A::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let arn = common::queue_arn(sqs, &dlq).await;
    let mut all: Vec<(A, String)> = attrs
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect();
    all.push((
        A::RedrivePolicy,
        json!({"deadLetterTargetArn": arn, "maxReceiveCount": r}).to_string(),
    ));
    common::create_queue(sqs, &common::unique_name("msrc"), &all).await
}

#[tokio::test]
async fn attributes_are_raised_to_the_rules_values_and_drift_is_corrected() {
    let e = env().await;
    // VT 5s (budget 7s, timeout needs 15s), maxReceiveCount 1, retention 1 minute (the breaker's
    // default hold of 1h outlives it)
    let url = queue_with_dlq(
        &e.sqs,
        &[
            (A::VisibilityTimeout, "5"),
            (A::MessageRetentionPeriod, "60"),
        ],
        1,
    )
    .await;
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "attributes"));
    e.reconcile("orders").await;

    let attrs = e.attrs(&url).await;
    assert_eq!(attrs["VisibilityTimeout"], "15");
    assert_eq!(max_receive_count(&attrs), 3);
    assert_eq!(attrs["MessageRetentionPeriod"], (2 * 3600).to_string());
    assert_eq!(
        e.changes("orders"),
        vec![
            ("VisibilityTimeout".into(), "5s".into(), "15s".into()),
            ("MaxReceiveCount".into(), "1".into(), "3".into()),
            ("MessageRetentionPeriod".into(), "1m".into(), "2h".into()),
        ]
    );
    let (status, reason, _) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "QueueAttributesUpdated")
    );
    let findings = e.findings("orders");
    for fixed in [
        "VisibilityTimeoutBelowBudget",
        "HandlerTimeoutBeyondVisibility",
        "MaxReceiveCountTooLow",
        "OutageHoldBeyondRetention",
    ] {
        assert!(
            !findings.contains(&fixed.to_string()),
            "{fixed} in {findings:?}"
        );
    }
    let notes = event_notes(&e.fake.take_requests(), "QueueAttributesUpdated");
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(
        notes[0].contains("VisibilityTimeout from 5s to 15s"),
        "{}",
        notes[0]
    );

    // in sync: nothing is written
    e.next_poll().await;
    e.reconcile("orders").await;
    assert_eq!(e.condition("orders").1, "QueueInSync");
    assert!(event_notes(&e.fake.take_requests(), "QueueAttributesUpdated").is_empty());

    // someone lowers the VT by hand: the next poll raises it again, and says so
    e.set(&url, A::VisibilityTimeout, "8").await;
    e.next_poll().await;
    e.reconcile("orders").await;
    assert_eq!(e.attrs(&url).await["VisibilityTimeout"], "15");
    assert_eq!(
        e.changes("orders"),
        vec![("VisibilityTimeout".into(), "8s".into(), "15s".into())]
    );
    let notes = event_notes(&e.fake.take_requests(), "QueueAttributesUpdated");
    assert!(
        notes
            .iter()
            .any(|n| n.contains("VisibilityTimeout from 8s to 15s")),
        "{notes:?}"
    );
}

#[tokio::test]
async fn retention_and_longer_settings_are_never_lowered() {
    let e = env().await;
    // retention 14 days and maxReceiveCount 10, more than the rules need; VT 5s too short
    let url = queue_with_dlq(
        &e.sqs,
        &[
            (A::VisibilityTimeout, "5"),
            (A::MessageRetentionPeriod, "1209600"),
        ],
        10,
    )
    .await;
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "attributes"));
    e.reconcile("orders").await;
    let attrs = e.attrs(&url).await;
    assert_eq!(attrs["VisibilityTimeout"], "15");
    assert_eq!(attrs["MessageRetentionPeriod"], "1209600");
    assert_eq!(max_receive_count(&attrs), 10);
    assert_eq!(
        e.changes("orders"),
        vec![("VisibilityTimeout".into(), "5s".into(), "15s".into())]
    );

    // a VT of an hour (more than the 15s needed): left as it is
    e.set(&url, A::VisibilityTimeout, "3600").await;
    e.next_poll().await;
    e.reconcile("orders").await;
    let attrs = e.attrs(&url).await;
    assert_eq!(attrs["VisibilityTimeout"], "3600");
    assert_eq!(attrs["MessageRetentionPeriod"], "1209600");
    assert_eq!(e.condition("orders").1, "QueueInSync");
}

#[tokio::test]
async fn a_suspended_consumer_does_not_touch_the_queue() {
    let e = env().await;
    let url = queue_with_dlq(&e.sqs, &[(A::VisibilityTimeout, "5")], 1).await;
    let mut m = manifest("orders", &url, "attributes");
    m["spec"]["suspend"] = json!(true);
    e.fake.create(QUEUE_CONSUMERS, m);
    e.reconcile("orders").await;
    let attrs = e.attrs(&url).await;
    assert_eq!(attrs["VisibilityTimeout"], "5");
    assert_eq!(max_receive_count(&attrs), 1);
    assert_eq!(
        e.condition("orders"),
        (
            "Unknown".into(),
            "Suspended".into(),
            "spec.suspend is true: the queue's settings are not touched".into()
        )
    );
}

#[tokio::test]
async fn two_consumers_wanting_other_values_conflict_and_change_nothing() {
    let e = env().await;
    let url = queue_with_dlq(&e.sqs, &[(A::VisibilityTimeout, "5")], 5).await;
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "attributes"));
    // p99 4s and timeout 20s: wants VT 25s
    let mut other = manifest("audit", &url, "attributes");
    other["spec"]["processing"]["p99"] = json!("4s");
    other["spec"]["processing"]["timeout"] = json!("20s");
    e.fake.create(QUEUE_CONSUMERS, other);

    e.reconcile("orders").await;
    e.reconcile("audit").await;
    assert_eq!(e.attrs(&url).await["VisibilityTimeout"], "5");
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ManageConflict")
    );
    assert!(message.contains("shop/audit"), "{message}");
    let (_, reason, message) = e.condition("audit");
    assert_eq!(reason, "ManageConflict");
    assert!(message.contains("shop/orders"), "{message}");
    assert!(e.changes("orders").is_empty());

    // one of them steps back (manage: off): the other now sets its values
    let mut off = e.fake.get(QUEUE_CONSUMERS, NS, "audit").expect("audit");
    off["spec"]["queue"]["manage"] = json!("off");
    e.fake.delete(QUEUE_CONSUMERS, NS, "audit");
    e.fake.create(QUEUE_CONSUMERS, off);
    e.next_poll().await;
    e.reconcile("orders").await;
    assert_eq!(e.attrs(&url).await["VisibilityTimeout"], "15");
    assert_eq!(e.condition("orders").1, "QueueAttributesUpdated");
}

async fn tags(sqs: &aws_sdk_sqs::Client, url: &str) -> HashMap<String, String> {
    sqs.list_queue_tags()
        .queue_url(url)
        .send()
        .await
        .expect("ListQueueTags")
        .tags
        .unwrap_or_default()
}

#[tokio::test]
async fn create_makes_standard_and_fifo_queues_with_their_dlq_wired() {
    let e = env().await;
    for (name, fifo) in [
        (common::unique_name("made"), false),
        (format!("{}.fifo", common::unique_name("made")), true),
    ] {
        let url = format!("{}/123456789012/{name}", common::sqs_endpoint());
        let consumer = format!("c{}", u8::from(fifo));
        e.fake
            .create(QUEUE_CONSUMERS, manifest(&consumer, &url, "create"));
        e.reconcile(&consumer).await;

        let attrs = e.attrs(&url).await;
        assert_eq!(attrs["VisibilityTimeout"], "15", "{name}");
        assert_eq!(
            attrs.get("FifoQueue").map(String::as_str),
            fifo.then_some("true")
        );
        let policy = qc::aws::facts::parse_redrive_policy(&attrs["RedrivePolicy"]).expect("policy");
        assert_eq!(policy.max_receive_count, 5);
        let dlq_name = qc::manage::dead_letter_name(&name);
        assert!(
            policy
                .dead_letter_target_arn
                .ends_with(&format!(":{dlq_name}"))
        );
        let dlq_url = format!("{}/123456789012/{dlq_name}", common::sqs_endpoint());
        let dlq = e.attrs(&dlq_url).await;
        assert_eq!(dlq["MessageRetentionPeriod"], "1209600");
        assert_eq!(
            dlq.get("FifoQueue").map(String::as_str),
            fifo.then_some("true")
        );
        for u in [&url, &dlq_url] {
            assert_eq!(
                tags(&e.sqs, u).await.get(qc::manage::TAG_QUEUE_CONSUMER),
                Some(&format!("{NS}/{consumer}")),
                "{u}"
            );
        }
        let (status, reason, _) = e.condition(&consumer);
        assert_eq!((status.as_str(), reason.as_str()), ("True", "QueueCreated"));
        // read again in the same reconcile: reachable, and no NoRedrivePolicy
        assert_eq!(
            fake_kube::condition_of(e.qc(&consumer), "QueueReachable").status,
            "True"
        );
        assert!(
            !e.findings(&consumer)
                .contains(&"NoRedrivePolicy".to_string())
        );
        let notes = event_notes(&e.fake.take_requests(), "QueueCreated");
        assert_eq!(notes.len(), 1, "{notes:?}");
    }
}

#[tokio::test]
async fn create_gives_an_existing_queue_without_redrive_policy_a_dlq() {
    let e = env().await;
    let name = common::unique_name("bare");
    let url = common::create_queue(&e.sqs, &name, &[(A::VisibilityTimeout, "30".into())]).await;
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "create"));
    e.reconcile("orders").await;
    let attrs = e.attrs(&url).await;
    let policy = qc::aws::facts::parse_redrive_policy(&attrs["RedrivePolicy"]).expect("policy");
    assert!(
        policy
            .dead_letter_target_arn
            .ends_with(&format!(":{name}-dlq"))
    );
    assert_eq!(policy.max_receive_count, 5);
    assert_eq!(attrs["VisibilityTimeout"], "30", "never lowered to 15s");
    assert!(
        !e.findings("orders")
            .contains(&"NoRedrivePolicy".to_string())
    );
    let changes = e.changes("orders");
    assert_eq!(changes[0].0, "Queue");
    assert_eq!(changes[1].0, "RedrivePolicy");
}

/// A live queue without a redrive policy that holds messages (its consumer may have received them many
/// times already) gets neither a DLQ nor a policy until it is empty: SQS would dead-letter those past the
/// new maxReceiveCount at their next receive, unhandled. Its other settings are raised meanwhile; one
/// Warning Event for the cause, not one per poll.
#[tokio::test]
async fn create_defers_the_redrive_policy_of_a_queue_that_holds_messages() {
    let e = env().await;
    let name = common::unique_name("busy");
    let url = common::create_queue(&e.sqs, &name, &[(A::VisibilityTimeout, "5".into())]).await;
    common::send_numbered(&e.sqs, &url, "m", 3).await;
    // One of them received six times already (released at once each time): receive count 6.
    for _ in 0..6 {
        let got = e
            .sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(1)
            .send()
            .await
            .expect("receive");
        let m = &got.messages.unwrap_or_default()[0];
        e.sqs
            .change_message_visibility()
            .queue_url(&url)
            .receipt_handle(m.receipt_handle.clone().unwrap())
            .visibility_timeout(0)
            .send()
            .await
            .expect("release");
    }
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "create"));
    for _ in 0..3 {
        e.reconcile("orders").await;
        e.next_poll().await;
    }
    let attrs = e.attrs(&url).await;
    assert!(!attrs.contains_key("RedrivePolicy"), "{attrs:?}");
    assert_eq!(attrs["VisibilityTimeout"], "15", "raised meanwhile");
    let dlqs = e
        .sqs
        .list_queues()
        .queue_name_prefix(format!("{name}-dlq"))
        .send()
        .await
        .expect("ListQueues")
        .queue_urls
        .unwrap_or_default();
    assert!(dlqs.is_empty(), "no DLQ yet: {dlqs:?}");
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "RedrivePolicyDeferred"),
        "{message}"
    );
    assert!(
        message.contains("holds 3 visible") && message.contains("more than 5 times"),
        "{message}"
    );
    let notes = event_notes(&e.fake.take_requests(), "RedrivePolicyDeferred");
    assert_eq!(notes.len(), 1, "one Event per cause: {notes:?}");

    // Drained: the DLQ and the policy, and every message was handled by the consumer, none moved.
    let mut handled = 0;
    while handled < 3 {
        let got = e
            .sqs
            .receive_message()
            .queue_url(&url)
            .max_number_of_messages(10)
            .send()
            .await
            .expect("receive");
        for m in got.messages.unwrap_or_default() {
            e.sqs
                .delete_message()
                .queue_url(&url)
                .receipt_handle(m.receipt_handle.unwrap())
                .send()
                .await
                .expect("delete");
            handled += 1;
        }
    }
    e.next_poll().await;
    e.reconcile("orders").await;
    let attrs = e.attrs(&url).await;
    let policy = qc::aws::facts::parse_redrive_policy(&attrs["RedrivePolicy"]).expect("policy");
    assert!(
        policy
            .dead_letter_target_arn
            .ends_with(&format!(":{name}-dlq")),
        "{policy:?}"
    );
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "QueueAttributesUpdated"),
        "{message}"
    );
}

#[tokio::test]
async fn attributes_mode_never_creates_a_missing_queue() {
    let e = env().await;
    let url = format!(
        "{}/123456789012/{}",
        common::sqs_endpoint(),
        common::unique_name("absent")
    );
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "attributes"));
    let _ = reconcile(Arc::new(e.qc("orders")), e.ctx.clone()).await;
    let missing = e
        .sqs
        .get_queue_attributes()
        .queue_url(&url)
        .send()
        .await
        .is_err();
    assert!(missing, "the queue was created under manage: attributes");
    assert_eq!(e.condition("orders").1, "QueueNotRead");
}

#[tokio::test]
async fn check_live_is_a_dry_run_that_changes_nothing() {
    let sqs = common::sqs_client().await;
    let url = queue_with_dlq(&sqs, &[(A::VisibilityTimeout, "5")], 1).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("qc.yaml");
    std::fs::write(
        &file,
        common::fixture::consumer("orders")
            .namespace(NS)
            .on_moto(&url)
            .p99("2s")
            .timeout("10s")
            .http(8080, "/messages")
            .set("/spec/processing/heartbeat", json!({"enabled": false}))
            .set("/spec/queue/manage", "attributes")
            .yaml(),
    )
    .expect("write manifest");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args(["check", "--live", "--allowed-endpoint"])
        .arg(common::sqs_endpoint())
        .arg(&file)
        .env_remove("AWS_ENDPOINT_URL")
        .output()
        .expect("run qc-operator check");
    let stdout = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "queue.manage would raise VisibilityTimeout from 5s to 15s",
        "queue.manage would raise MaxReceiveCount from 1 to 3",
        "dry run: nothing was changed",
    ] {
        assert!(stdout.contains(expected), "{expected} missing:\n{stdout}");
    }
    let attrs: HashMap<String, String> = sqs
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(A::All)
        .send()
        .await
        .expect("GetQueueAttributes")
        .attributes
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| (k.as_str().to_string(), v))
        .collect();
    assert_eq!(attrs["VisibilityTimeout"], "5");
    assert_eq!(max_receive_count(&attrs), 1);
}

#[tokio::test]
async fn a_consumer_the_tenancy_policy_refuses_never_changes_its_queue() {
    let sqs = common::sqs_client().await;
    let url = queue_with_dlq(&sqs, &[(A::VisibilityTimeout, "5")], 1).await;
    let e = env_with(sqs, Some("rules: [{namespaces: [team-a]}]"));
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "create"));
    let _ = reconcile(Arc::new(e.qc("orders")), e.ctx.clone()).await;
    let attrs = e.attrs(&url).await;
    assert_eq!(attrs["VisibilityTimeout"], "5");
    assert_eq!(max_receive_count(&attrs), 1);
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NamespaceNotInPolicy")
    );
    assert!(message.contains("tenancy"), "{message}");
}

#[tokio::test]
async fn create_makes_no_dead_letter_queue_the_namespace_rule_does_not_allow() {
    let sqs = common::sqs_client().await;
    let name = common::unique_name("ruled");
    let url = common::create_queue(&sqs, &name, &[(A::VisibilityTimeout, "5".into())]).await;
    // the rule allows the source queue only, not NAME-dlq
    let policy = format!("rules: [{{namespaces: [shop], queues: [\"arn:aws:sqs:*:*:{name}\"]}}]");
    let e = env_with(sqs, Some(&policy));
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "create"));
    e.reconcile("orders").await;
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "DeadLetterQueueNotAllowed")
    );
    assert!(message.contains(&format!("{name}-dlq")), "{message}");
    let dlq_url = format!("{}/123456789012/{name}-dlq", common::sqs_endpoint());
    assert!(
        e.sqs
            .get_queue_attributes()
            .queue_url(&dlq_url)
            .send()
            .await
            .is_err(),
        "the DLQ was created"
    );
    assert_eq!(e.attrs(&url).await["VisibilityTimeout"], "5");
}

#[tokio::test]
async fn a_namespace_whose_rule_allows_less_than_asked_gets_nothing_changed() {
    let sqs = common::sqs_client().await;
    let url = queue_with_dlq(&sqs, &[(A::VisibilityTimeout, "5")], 1).await;
    let e = env_with(sqs, Some("rules: [{namespaces: [shop], manage: off}]"));
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "attributes"));
    e.reconcile("orders").await;
    assert_eq!(e.attrs(&url).await["VisibilityTimeout"], "5");
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ManageNotAllowed")
    );
    assert!(message.contains("tenancy.rules[0].manage"), "{message}");
    // the queue is still read and its findings reported
    assert!(
        e.findings("orders")
            .contains(&"VisibilityTimeoutBelowBudget".to_string())
    );
}

/// #41 item 3: `create` on a URL of another account than the one the calls act in (moto's default
/// identity is account 123456789012; the URL names 222222222222) creates nothing anywhere: before,
/// CreateQueue put the queue in the caller's account. QueueManaged is False with the account to
/// assume a role in, and three reconciles make one Warning Event, not three.
#[tokio::test]
async fn create_on_another_accounts_url_creates_nothing_and_makes_one_event() {
    let e = env().await;
    let name = common::unique_name("xacct");
    let url = format!("{}/222222222222/{name}", common::sqs_endpoint());
    e.fake
        .create(QUEUE_CONSUMERS, manifest("orders", &url, "create"));
    for _ in 0..3 {
        // An error (the queue does not exist): the reconcile backs off.
        let _ = reconcile(Arc::new(e.qc("orders")), e.ctx.clone()).await;
    }
    let (status, reason, message) = e.condition("orders");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "QueueInAnotherAccount"),
        "{message}"
    );
    assert!(
        message.contains("222222222222") && message.contains("spec.aws.roleArn"),
        "{message}"
    );
    assert!(
        !message.contains("123456789012"),
        "the operator's own account is not shown to the tenant: {message}"
    );
    let listed = e
        .sqs
        .list_queues()
        .queue_name_prefix(&name)
        .send()
        .await
        .expect("ListQueues")
        .queue_urls
        .unwrap_or_default();
    assert!(listed.is_empty(), "nothing created: {listed:?}");
    let notes = event_notes(&e.fake.take_requests(), "QueueInAnotherAccount");
    assert_eq!(notes.len(), 1, "one Event per cause: {notes:?}");
}
