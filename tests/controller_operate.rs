//! Day-2 operations wired into reconcile, against the in-memory Kubernetes API and a real SQS server
//! (moto): `spec.suspend` (scale to zero through the scaler, paused scaling, resume) and DLQ redrive on
//! the annotation `sqs.consumers.dev/redrive-request` (the controller's own move on moto, which has no
//! move tasks; SQS's move task against a scripted stand-in for StartMessageMoveTask and
//! ListMessageMoveTasks that forwards every other call to moto).

mod common;
mod fake_kube;

use std::sync::Arc;

use fake_kube::aws::{UnreachableCloudWatch, context};
use fake_kube::{DEPLOYMENTS, EVENTS, FakeKube, QUEUE_CONSUMERS, Recorded};
use k8s_openapi::api::apps::v1::Deployment;
use qc::api::QueueConsumer;
use qc::aws::SqsReader;
use qc::controller::{Context, reconcile};
use serde_json::{Value, json};

const NS: &str = "shop";

struct Env {
    fake: FakeKube,
    ctx: Arc<Context>,
    sqs: aws_sdk_sqs::Client,
    url: String,
}

/// A queue with a DLQ (no Error finding, so `Ready` can be True) on moto.
async fn env() -> Env {
    let sqs = common::sqs_client().await;
    let dlq = common::create_queue(
        &sqs,
        &common::unique_name("sdlq"),
        &[(
            QueueAttributeName::MessageRetentionPeriod,
            "1209600".to_string(),
        )],
    )
    .await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    let url = common::create_queue(
        &sqs,
        &common::unique_name("suspend"),
        &[(
            QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )],
    )
    .await;
    let fake = FakeKube::new();
    let ctx = context(
        &fake,
        Arc::new(SqsReader::new(sqs.clone())),
        Arc::new(UnreachableCloudWatch),
        None,
    );
    Env {
        fake,
        ctx,
        sqs,
        url,
    }
}

/// P99 2s, concurrency 1, maxBacklogAge 2s: one replica per visible message. Poll every second.
fn manifest(url: &str, suspend: bool) -> Value {
    common::fixture::moto_consumer(NS, url)
        .p99("2s")
        .concurrency(1)
        .suspend(suspend)
        .scaling(
            json!({"pollInterval": "1s", "maxBacklogAge": "2s", "maxReplicas": 4,
                        "scaleDownStabilization": "1m"}),
        )
        .json()
}

impl Env {
    fn qc(&self) -> QueueConsumer {
        serde_json::from_value(self.fake.get(QUEUE_CONSUMERS, NS, "orders").unwrap()).unwrap()
    }

    async fn reconcile(&self) {
        reconcile(Arc::new(self.qc()), self.ctx.clone())
            .await
            .unwrap();
    }

    fn replicas(&self) -> Option<i32> {
        let d: Deployment =
            serde_json::from_value(self.fake.get(DEPLOYMENTS, NS, "orders").unwrap()).unwrap();
        d.spec.replicas
    }

    fn condition(&self, type_: &str) -> (String, String, String) {
        let c = fake_kube::condition_of(self.qc(), type_);
        (c.status, c.reason, c.message)
    }

    async fn next_poll(&self) {
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    }

    fn set_suspend(&self, on: bool) {
        self.fake.update(QUEUE_CONSUMERS, NS, "orders", |o| {
            o["spec"]["suspend"] = json!(on);
        });
    }

    async fn send(&self, n: usize) {
        common::send_numbered(&self.sqs, &self.url, "order", n).await;
    }

    fn mark(&self) -> usize {
        self.fake.requests().len()
    }

    fn since(&self, mark: usize) -> Vec<Recorded> {
        self.fake.requests().split_off(mark)
    }
}

/// `spec.replicas` values the scaler applied.
fn scaler_writes(reqs: &[Recorded]) -> Vec<i64> {
    reqs.iter()
        .filter(|r| r.is_write() && r.targets(DEPLOYMENTS))
        .filter(|r| r.field_manager() == Some("qc-operator-scaler"))
        .map(|r| {
            r.body.as_ref().unwrap()["spec"]["replicas"]
                .as_i64()
                .unwrap()
        })
        .collect()
}

/// (reason, note) of the Events created.
fn events(reqs: &[Recorded]) -> Vec<(String, String)> {
    reqs.iter()
        .filter(|r| r.method == "POST" && r.targets(EVENTS))
        .filter_map(|r| {
            let b = r.body.as_ref()?;
            Some((
                b["reason"].as_str()?.to_string(),
                b["note"].as_str().unwrap_or("").to_string(),
            ))
        })
        .collect()
}

#[tokio::test]
async fn suspend_scales_to_zero_pauses_the_scaler_and_false_resumes_at_the_next_poll() {
    let e = env().await;
    e.fake.create(QUEUE_CONSUMERS, manifest(&e.url, false));
    e.reconcile().await;
    e.send(3).await;
    for _ in 0..2 {
        e.next_poll().await;
        e.reconcile().await;
    }
    assert_eq!(e.replicas(), Some(3), "3 visible, one replica each");

    // Suspend: one scaler write to 0, an Event that says why, ScalingActive False/Suspended, Ready True.
    e.set_suspend(true);
    let mark = e.mark();
    e.reconcile().await;
    let reqs = e.since(mark);
    assert_eq!(scaler_writes(&reqs), [0]);
    assert_eq!(e.replicas(), Some(0));
    let evs = events(&reqs);
    assert!(
        evs.iter()
            .any(|(r, n)| r == "Scaled" && n.contains("from 3 to 0") && n.contains("suspend")),
        "{evs:?}"
    );
    let (status, reason, message) = e.condition("ScalingActive");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Suspended"));
    assert!(message.contains("3 replica(s) to 0"), "{message}");
    let (ready, _, ready_message) = e.condition("Ready");
    assert_eq!(
        ready, "True",
        "zero on purpose is available: {ready_message}"
    );
    assert_eq!(e.qc().status.unwrap().desired_replicas, Some(0));

    // The backlog is still there (and grows): nothing is scaled while suspended.
    e.send(1).await;
    for _ in 0..2 {
        e.next_poll().await;
        let mark = e.mark();
        e.reconcile().await;
        assert!(scaler_writes(&e.since(mark)).is_empty());
        assert_eq!(e.replicas(), Some(0));
    }
    let (status, reason, message) = e.condition("ScalingActive");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Suspended"));
    assert!(message.contains("0 replicas"), "{message}");

    // Someone scales the Deployment by hand while suspended: back to 0 at the next reconcile.
    e.fake.update(DEPLOYMENTS, NS, "orders", |d| {
        d["spec"]["replicas"] = json!(2);
    });
    let mark = e.mark();
    e.reconcile().await;
    assert_eq!(scaler_writes(&e.since(mark)), [0]);

    // Resume: the next poll scales on the backlog again (4 visible), no new activation wait since
    // sampling went on while suspended.
    e.set_suspend(false);
    e.next_poll().await;
    let mark = e.mark();
    e.reconcile().await;
    assert_eq!(scaler_writes(&e.since(mark)), [4]);
    let (status, reason, _) = e.condition("ScalingActive");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Scaling"));
}

#[tokio::test]
async fn a_queue_consumer_created_suspended_runs_no_replica() {
    let e = env().await;
    e.send(2).await;
    e.fake.create(QUEUE_CONSUMERS, manifest(&e.url, true));
    e.reconcile().await;
    // The API server defaulted the new Deployment to 1: the same reconcile takes it to 0.
    assert_eq!(e.replicas(), Some(0));
    let (status, reason, _) = e.condition("ScalingActive");
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Suspended"));
    assert_eq!(e.condition("Ready").0, "True");
}

// ---- redrive ----

use std::sync::Mutex;

use aws_sdk_sqs::types::QueueAttributeName;
use fake_kube::aws::TEST_WORKER_IMAGE;
use qc::aws::QueueReader;
use qc::controller::observe::{AwsClients, AwsProvider, AwsTarget};
use qc::render::RenderOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Reads through `reader`; redrives through `redrive` (an SDK client, possibly aimed elsewhere).
struct Provider {
    reader: Arc<dyn QueueReader>,
    redrive: aws_sdk_sqs::Client,
}

#[async_trait::async_trait]
impl AwsProvider for Provider {
    async fn clients(&self, _: &AwsTarget) -> AwsClients {
        AwsClients {
            sqs: self.reader.clone(),
            alarms: Arc::new(UnreachableCloudWatch),
        }
    }
    async fn redrive_client(&self, _: &AwsTarget) -> Option<aws_sdk_sqs::Client> {
        Some(self.redrive.clone())
    }
}

struct RedriveEnv {
    e: Env,
    dlq: String,
}

/// A source queue with a DLQ on moto; the controller redrives through a client aimed at `redrive_endpoint`
/// (moto itself when None).
async fn redrive_env(redrive_endpoint: Option<String>) -> RedriveEnv {
    let sqs = common::sqs_client().await;
    let dlq = common::create_queue(&sqs, &common::unique_name("odlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    let url = common::create_queue(
        &sqs,
        &common::unique_name("osrc"),
        &[(
            QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )],
    )
    .await;
    let endpoint = redrive_endpoint.unwrap_or_else(common::sqs_endpoint);
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&endpoint)).await;
    let fake = FakeKube::new();
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(Provider {
            reader: Arc::new(SqsReader::new(sqs.clone())),
            redrive: aws_sdk_sqs::Client::new(&conf),
        }),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        None,
    );
    // The manifests name moto in spec.queue.endpoint: allowed explicitly, as an operator would.
    ctx.endpoints = qc::aws::endpoints::AllowedEndpoints::parse([common::sqs_endpoint()])
        .expect("the test SQS endpoint is an http://HOST:PORT endpoint");
    let ctx = Arc::new(ctx);
    RedriveEnv {
        e: Env {
            fake,
            ctx,
            sqs,
            url,
        },
        dlq,
    }
}

impl RedriveEnv {
    fn annotate(&self, token: &str) {
        self.e.fake.update(QUEUE_CONSUMERS, NS, "orders", |o| {
            o["metadata"]["annotations"] = json!({"sqs.consumers.dev/redrive-request": token});
        });
    }

    fn redrive(&self) -> qc::api::RedriveStatus {
        self.e
            .qc()
            .status
            .unwrap()
            .dead_letter
            .unwrap()
            .redrive
            .expect("status.deadLetter.redrive")
    }

    async fn send_to_dlq(&self, n: usize) {
        common::send_numbered(&self.e.sqs, &self.dlq, "failed order", n).await;
    }

    async fn visible(&self, url: &str) -> i64 {
        let a = self
            .e
            .sqs
            .get_queue_attributes()
            .queue_url(url)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .unwrap()
            .attributes
            .unwrap();
        let n = |k| a.get(&k).unwrap().parse::<i64>().unwrap();
        n(QueueAttributeName::ApproximateNumberOfMessages)
            + n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
    }

    /// Reconcile until the redrive is no longer Running (bounded: 60 reconciles, 250ms apart).
    async fn until_done(&self) -> Vec<(String, String)> {
        let mark = self.e.mark();
        for _ in 0..60 {
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
            self.e.reconcile().await;
            if self.redrive().state.as_deref() != Some("Running") {
                return events(&self.e.since(mark));
            }
        }
        panic!("redrive still running: {:?}", self.redrive());
    }
}

fn redrive_events(evs: &[(String, String)]) -> Vec<(String, String)> {
    evs.iter()
        .filter(|(r, _)| r.starts_with("Redrive"))
        .cloned()
        .collect()
}

#[tokio::test]
async fn the_annotation_moves_the_dlq_back_once_per_token_and_a_new_token_waits_for_the_running_move()
 {
    let r = redrive_env(None).await;
    r.send_to_dlq(60).await;
    r.e.fake.create(QUEUE_CONSUMERS, manifest(&r.e.url, false));
    r.e.reconcile().await;
    assert!(
        r.e.qc()
            .status
            .unwrap()
            .dead_letter
            .unwrap()
            .redrive
            .is_none(),
        "no annotation, no redrive"
    );

    r.annotate("t1");
    let mark = r.e.mark();
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(s.request.as_deref(), Some("t1"));
    assert_eq!(s.state.as_deref(), Some("Running"), "{s:?}");
    // moto has no StartMessageMoveTask: the controller moves the messages itself.
    assert_eq!(s.method.as_deref(), Some("ReceiveSendDelete"));
    assert!(s.started_at.is_some() && s.finished_at.is_none());
    let evs = redrive_events(&events(&r.e.since(mark)));
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].0, "RedriveStarted");
    assert!(
        evs[0].1.contains(&r.dlq) && evs[0].1.contains(&r.e.url),
        "{}",
        evs[0].1
    );

    // 60 messages at 50 per second: still running when a second token arrives, which waits.
    r.annotate("t2");
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(s.request.as_deref(), Some("t1"));
    if s.state.as_deref() == Some("Running") {
        let m = s.message.unwrap_or_default();
        assert!(m.contains("\"t2\" waits"), "{m}");
    }

    let evs = redrive_events(&r.until_done().await);
    let s = r.redrive();
    assert_eq!(
        (s.request.as_deref(), s.state.as_deref()),
        (Some("t1"), Some("Completed")),
        "{s:?}"
    );
    assert_eq!((s.moved, s.failed, s.skipped), (Some(60), Some(0), Some(0)));
    assert!(s.finished_at.is_some());
    assert!(
        evs.iter()
            .any(|(r, n)| r == "RedriveCompleted" && n.contains("moved 60 message(s)")),
        "{evs:?}"
    );
    assert_eq!(r.visible(&r.dlq).await, 0, "the DLQ is empty");
    assert_eq!(r.visible(&r.e.url).await, 60, "all back in the source");

    // The waiting token starts now, on an empty DLQ.
    let mark = r.e.mark();
    r.e.reconcile().await;
    assert_eq!(r.redrive().request.as_deref(), Some("t2"));
    let mut evs = redrive_events(&events(&r.e.since(mark)));
    evs.extend(redrive_events(&r.until_done().await));
    let s = r.redrive();
    assert_eq!((s.state.as_deref(), s.moved), (Some("Completed"), Some(0)));
    assert_eq!(
        evs.iter().map(|(r, _)| r.as_str()).collect::<Vec<_>>(),
        ["RedriveStarted", "RedriveCompleted"]
    );

    // The same token again: nothing moves, nothing is said.
    r.send_to_dlq(2).await;
    let mark = r.e.mark();
    for _ in 0..3 {
        r.e.next_poll().await;
        r.e.reconcile().await;
    }
    assert!(redrive_events(&events(&r.e.since(mark))).is_empty());
    assert_eq!(r.visible(&r.dlq).await, 2);
}

#[tokio::test]
async fn a_failing_redrive_does_not_hold_back_scaling() {
    // Redrive calls go to a port nobody listens on; the queue is read from moto and has 3 visible.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = redrive_env(Some(format!("http://127.0.0.1:{port}"))).await;
    r.e.send(3).await;
    let mut m = manifest(&r.e.url, false);
    m["metadata"]["annotations"] = json!({"sqs.consumers.dev/redrive-request": "t1"});
    r.e.fake.create(QUEUE_CONSUMERS, m);
    r.e.reconcile().await;
    let evs = r.until_done().await;
    for _ in 0..2 {
        r.e.next_poll().await;
        r.e.reconcile().await;
    }
    assert_eq!(
        r.e.replicas(),
        Some(3),
        "scaled on the backlog all the same"
    );
    let s = r.redrive();
    assert_eq!(s.state.as_deref(), Some("Failed"), "{s:?}");
    let message = s.message.unwrap();
    assert!(message.contains("ReceiveMessage"), "{message}");
    let failed: Vec<_> = redrive_events(&evs)
        .into_iter()
        .filter(|(r, _)| r == "RedriveFailed")
        .collect();
    assert_eq!(failed.len(), 1, "{evs:?}");
}

#[tokio::test]
async fn a_queue_without_a_dlq_fails_the_redrive_with_the_reason() {
    let r = redrive_env(None).await;
    let url = common::create_queue(&r.e.sqs, &common::unique_name("nodlq"), &[]).await;
    let mut m = manifest(&url, false);
    m["metadata"]["annotations"] = json!({"sqs.consumers.dev/redrive-request": "t1"});
    r.e.fake.create(QUEUE_CONSUMERS, m);
    let mark = r.e.mark();
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(s.state.as_deref(), Some("Failed"));
    assert!(
        s.message
            .as_deref()
            .unwrap()
            .contains("has no redrive policy"),
        "{s:?}"
    );
    let evs = redrive_events(&events(&r.e.since(mark)));
    assert_eq!(evs.len(), 1);
    assert_eq!(evs[0].0, "RedriveFailed");
}

// ---- the scripted stand-in for StartMessageMoveTask / ListMessageMoveTasks ----

/// What the stand-in says about the current task, and what it was asked.
#[derive(Default)]
struct Script {
    /// (status, moved, failure reason) ListMessageMoveTasks reports for the latest task.
    task: (String, i64, Option<String>),
    /// Bodies of the StartMessageMoveTask requests.
    starts: Vec<Value>,
}

/// An SQS endpoint that answers StartMessageMoveTask and ListMessageMoveTasks from `script` (moto has
/// neither) and forwards every other request to moto unchanged. One request per connection.
async fn stand_in(script: Arc<Mutex<Script>>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let moto = common::sqs_endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let script = script.clone();
            let moto = moto.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let head_end = loop {
                    let n = sock.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                let header = |name: &str| {
                    head.lines()
                        .filter_map(|l| l.split_once(':'))
                        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
                        .map(|(_, v)| v.trim().to_string())
                };
                let len: usize = header("content-length")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                while buf.len() < head_end + len {
                    let n = sock.read(&mut chunk).await.unwrap();
                    if n == 0 {
                        break;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let body = &buf[head_end..];
                let target = header("x-amz-target").unwrap_or_default();
                let answer = |json: Value| {
                    let b = json.to_string();
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/x-amz-json-1.0\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                        b.len()
                    )
                };
                let response = match target.as_str() {
                    "AmazonSQS.StartMessageMoveTask" => {
                        let mut s = script.lock().unwrap();
                        s.starts.push(serde_json::from_slice(body).unwrap());
                        s.task = ("RUNNING".into(), 0, None);
                        answer(json!({"TaskHandle": format!("scripted-task-{}", s.starts.len())}))
                    }
                    "AmazonSQS.ListMessageMoveTasks" => {
                        let s = script.lock().unwrap();
                        let mut entry = json!({
                            "TaskHandle": format!("scripted-task-{}", s.starts.len()),
                            "Status": s.task.0,
                            "ApproximateNumberOfMessagesMoved": s.task.1,
                            "ApproximateNumberOfMessagesToMove": 25,
                            "StartedTimestamp": 1_700_000_000_000i64,
                        });
                        if let Some(reason) = &s.task.2 {
                            entry["FailureReason"] = json!(reason);
                        }
                        answer(json!({"Results": [entry]}))
                    }
                    _ => {
                        // Forward to moto, asking it to close so the answer ends at EOF.
                        let mut up = tokio::net::TcpStream::connect(&moto).await.unwrap();
                        let mut fwd = String::new();
                        for line in head.trim_end().lines() {
                            if !line.to_ascii_lowercase().starts_with("connection:") {
                                fwd.push_str(line);
                                fwd.push_str("\r\n");
                            }
                        }
                        fwd.push_str("connection: close\r\n\r\n");
                        up.write_all(fwd.as_bytes()).await.unwrap();
                        up.write_all(body).await.unwrap();
                        let mut resp = Vec::new();
                        up.read_to_end(&mut resp).await.unwrap();
                        sock.write_all(&resp).await.unwrap();
                        let _ = sock.shutdown().await;
                        return;
                    }
                };
                sock.write_all(response.as_bytes()).await.unwrap();
                let _ = sock.shutdown().await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn message_move_task_path_against_a_scripted_stand_in_for_the_move_task_calls() {
    let script = Arc::new(Mutex::new(Script::default()));
    let endpoint = stand_in(script.clone()).await;
    let r = redrive_env(Some(endpoint)).await;
    let dlq_arn = common::queue_arn(&r.e.sqs, &r.dlq).await;
    let src_arn = common::queue_arn(&r.e.sqs, &r.e.url).await;
    r.e.fake.create(QUEUE_CONSUMERS, manifest(&r.e.url, false));
    r.e.reconcile().await;

    // Start: one task from the DLQ to this source, at the controller's rate.
    r.annotate("t1");
    let mark = r.e.mark();
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(
        (
            s.state.as_deref(),
            s.method.as_deref(),
            s.task_handle.as_deref()
        ),
        (
            Some("Running"),
            Some("MessageMoveTask"),
            Some("scripted-task-1")
        )
    );
    assert_eq!(
        script.lock().unwrap().starts,
        [
            json!({"SourceArn": dlq_arn, "DestinationArn": src_arn, "MaxNumberOfMessagesPerSecond": 50})
        ]
    );
    let evs = redrive_events(&events(&r.e.since(mark)));
    assert_eq!(evs.len(), 1);
    assert!(
        evs[0].0 == "RedriveStarted" && evs[0].1.contains("scripted-task-1"),
        "{evs:?}"
    );

    // Progress is followed through ListMessageMoveTasks.
    script.lock().unwrap().task = ("RUNNING".into(), 10, None);
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(s.moved, Some(10));
    assert_eq!(s.message.as_deref(), Some("10 of about 25 moved"));

    // A new token while the task runs: no second task (SQS allows one per queue); it waits.
    r.annotate("t2");
    r.e.reconcile().await;
    assert_eq!(script.lock().unwrap().starts.len(), 1);
    let s = r.redrive();
    assert_eq!(s.request.as_deref(), Some("t1"));
    assert!(s.message.unwrap().contains("\"t2\" waits"));

    // Completed: the event says how many.
    script.lock().unwrap().task = ("COMPLETED".into(), 25, None);
    let mark = r.e.mark();
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(
        (s.request.as_deref(), s.state.as_deref(), s.moved),
        (Some("t1"), Some("Completed"), Some(25))
    );
    let evs = redrive_events(&events(&r.e.since(mark)));
    assert!(
        evs.len() == 1 && evs[0].0 == "RedriveCompleted" && evs[0].1.contains("moved 25"),
        "{evs:?}"
    );

    // The waiting token starts its own task; this one fails, and says why.
    r.e.reconcile().await;
    assert_eq!(script.lock().unwrap().starts.len(), 2);
    assert_eq!(r.redrive().task_handle.as_deref(), Some("scripted-task-2"));
    script.lock().unwrap().task = (
        "FAILED".into(),
        3,
        Some("AWS.SimpleQueueService.NonExistentQueue".into()),
    );
    let mark = r.e.mark();
    r.e.reconcile().await;
    let s = r.redrive();
    assert_eq!(
        (s.request.as_deref(), s.state.as_deref(), s.moved),
        (Some("t2"), Some("Failed"), Some(3))
    );
    assert!(s.message.unwrap().contains("NonExistentQueue"));
    let evs = redrive_events(&events(&r.e.since(mark)));
    assert!(
        evs.len() == 1 && evs[0].0 == "RedriveFailed" && evs[0].1.contains("NonExistentQueue"),
        "{evs:?}"
    );
}

/// `status.deadLetter.byReason`: the controller peeks at the DLQ (exact counts by `qc-poison-reason`),
/// releases everything at once (all still visible after the reconcile, none deleted), and does not peek
/// again within 5 minutes (each peek costs a receive count).
#[tokio::test]
async fn the_dlq_is_summarised_by_reason_in_status_without_consuming_it() {
    let r = redrive_env(None).await;
    let reason = |v: &str| {
        aws_sdk_sqs::types::MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .unwrap()
    };
    for (body, why) in [
        ("a1", Some("handler answered HTTP 422")),
        ("a2", Some("handler answered HTTP 422")),
        ("a3", Some("handler answered HTTP 422")),
        ("n1", None),
        ("n2", None),
    ] {
        let mut req = r.e.sqs.send_message().queue_url(&r.dlq).message_body(body);
        if let Some(w) = why {
            req = req.message_attributes("qc-poison-reason", reason(w));
        }
        req.send().await.unwrap();
    }
    r.e.fake.create(QUEUE_CONSUMERS, manifest(&r.e.url, false));
    r.e.reconcile().await;
    let dl = r.e.qc().status.unwrap().dead_letter.unwrap();
    let got: Vec<(String, i64)> = dl
        .by_reason
        .iter()
        .map(|c| (c.reason.clone(), c.count))
        .collect();
    assert_eq!(
        got,
        [
            ("handler answered HTTP 422".to_string(), 3),
            ("(none)".to_string(), 2)
        ]
    );
    let sampled = dl.by_reason_sampled_at.clone().expect("sampledAt");
    // Released at once: all five visible again.
    let a =
        r.e.sqs
            .get_queue_attributes()
            .queue_url(&r.dlq)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .unwrap();
    assert_eq!(
        a.attributes().unwrap()[&QueueAttributeName::ApproximateNumberOfMessages],
        "5"
    );
    // The next poll keeps the summary without peeking again.
    r.e.next_poll().await;
    r.e.reconcile().await;
    let dl = r.e.qc().status.unwrap().dead_letter.unwrap();
    assert_eq!(dl.by_reason_sampled_at, Some(sampled));
    assert_eq!(dl.by_reason.len(), 2);
    let got =
        r.e.sqs
            .receive_message()
            .queue_url(&r.dlq)
            .max_number_of_messages(10)
            .message_system_attribute_names(
                aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount,
            )
            .send()
            .await
            .unwrap()
            .messages
            .unwrap_or_default();
    assert_eq!(got.len(), 5);
    for m in &got {
        assert_eq!(
            m.attributes().unwrap()
                [&aws_sdk_sqs::types::MessageSystemAttributeName::ApproximateReceiveCount],
            "2",
            "one peek, then this receive"
        );
    }
}
