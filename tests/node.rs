//! The whole product as Kubernetes runs it (issue 43): a real node (the kubelet with containerd and runc,
//! pods on a CNI bridge; scripts/k8s-node.sh) under the real control plane, the operator installed with
//! helm and running in cluster from its image (2 replicas, leader election, its ServiceAccount, probes,
//! the restricted profile), worker pods of the product's image with the test handler's image beside them,
//! consuming from a moto the pods reach on the node's address.
//!
//! Each scenario asserts on SQS (queue, DLQ) and Kubernetes (Deployment, pods, Lease, status) state, and
//! counts what the handler saw from the file it appends each message id to (a hostPath of the node): every
//! message sent is handled exactly once, with no idempotency store to hide a second delivery.
//!
//! In a cluster the pods' AWS credentials come from IRSA or EKS Pod Identity, whose webhook adds
//! environment variables to the pods; here a MutatingAdmissionPolicy (CEL, in the API server) adds moto's
//! test keys the same way to every container of the labelled namespaces. The node runs no kube-proxy: the
//! operator reaches the API server on the node's address (KUBERNETES_SERVICE_HOST/PORT in the chart's
//! extraEnv), the controller scrapes the workers by pod IP as it always does.
//!
//! With `QC_REQUIRE_NODE=1` (scripts/test) these tests cannot skip.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use aws_sdk_sqs::types::{QueueAttributeName as A, SendMessageBatchRequestEntry};
use common::cluster::{self, Cluster, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use qc::api::QueueConsumer;
use serde_json::{Value, json};

/// One scenario at a time: each runs an operator and up to three workers on a 2-core machine, and (f)
/// kills a controller.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Label of the namespaces whose pods get moto's keys from the admission policy.
const KEYS_LABEL: &str = "qc.test/aws-keys";

/// The node, its moto and the images imported into it.
struct Node {
    cluster: Cluster,
    /// moto on the node's address, which pods reach.
    endpoint: String,
    taint: String,
    /// The product image (operator and worker): (repository without `localhost/`, tag).
    image: (String, String),
    handler_image: String,
    api_host: String,
    api_port: String,
}

/// The node, or None after a loud skip message (a failure when `QC_REQUIRE_NODE=1`).
async fn node(test: &str) -> Option<Node> {
    let required = std::env::var("QC_REQUIRE_NODE").as_deref() == Ok("1");
    let endpoint = match std::env::var("QC_TEST_NODE_SQS_ENDPOINT") {
        Ok(e) if !e.is_empty() => e,
        _ => {
            assert!(
                !required,
                "{test}: QC_REQUIRE_NODE=1 but QC_TEST_NODE_SQS_ENDPOINT is not set: source scripts/lib.sh and \
                 run start_k8s_node"
            );
            eprintln!(
                "\n!!! SKIPPED {test}: no Kubernetes node (QC_TEST_NODE_SQS_ENDPOINT unset). scripts/test starts \
                 one as root (docs/testing.md).\n"
            );
            return None;
        }
    };
    let cluster = cluster::connect(test).await?;
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let image = var("QC_TEST_IMAGE");
    let (repo, tag) = image
        .strip_prefix("localhost/")
        .and_then(|i| i.rsplit_once(':'))
        .unwrap_or_else(|| panic!("QC_TEST_IMAGE {image} is not localhost/REPOSITORY:TAG"));
    let kubeconfig = std::fs::read_to_string(&cluster.kubeconfig).expect("the kubeconfig");
    let server = kubeconfig
        .lines()
        .find_map(|l| l.split("server: \"https://").nth(1))
        .and_then(|s| s.split('"').next())
        .expect("the API server's address in the kubeconfig")
        .to_string();
    let (api_host, api_port) = server.rsplit_once(':').expect("host:port");
    let node = Node {
        endpoint,
        taint: var("QC_TEST_NODE_TAINT"),
        image: (repo.to_string(), tag.to_string()),
        handler_image: var("QC_TEST_HANDLER_IMAGE"),
        api_host: api_host.to_string(),
        api_port: api_port.to_string(),
        cluster,
    };
    node.keys_policy();
    Some(node)
}

impl Node {
    async fn sqs(&self) -> aws_sdk_sqs::Client {
        let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&self.endpoint)).await;
        aws_sdk_sqs::Client::new(&conf)
    }

    /// The admission policy that hands moto's keys to the pods of labelled namespaces (applied by every
    /// test; the apply is idempotent).
    fn keys_policy(&self) {
        let policy = format!(
            r#"apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicy
metadata: {{name: qc-test-aws-keys}}
spec:
  matchConstraints:
    resourceRules: [{{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}}]
  failurePolicy: Fail
  reinvocationPolicy: Never
  mutations:
    - patchType: ApplyConfiguration
      applyConfiguration:
        expression: >
          Object{{spec: Object.spec{{containers: object.spec.containers.map(c, Object.spec.containers{{
            name: c.name,
            env: [Object.spec.containers.env{{name: "AWS_ACCESS_KEY_ID", value: "testing"}},
                  Object.spec.containers.env{{name: "AWS_SECRET_ACCESS_KEY", value: "testing"}}]}})}}}}
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingAdmissionPolicyBinding
metadata: {{name: qc-test-aws-keys}}
spec:
  policyName: qc-test-aws-keys
  matchResources:
    namespaceSelector: {{matchLabels: {{{KEYS_LABEL}: moto}}}}
"#
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let file = dir.path().join("policy.yaml");
        std::fs::write(&file, policy).expect("write the policy");
        self.cluster.run(
            "kubectl",
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                file.to_str().expect("utf-8"),
            ],
        );
    }

    /// A namespace whose pods get moto's keys; `restricted`: enforcing the restricted profile.
    async fn namespace(&self, name: &str, restricted: bool) {
        let mut labels = json!({KEYS_LABEL: "moto"});
        if restricted {
            labels["pod-security.kubernetes.io/enforce"] = "restricted".into();
            labels["pod-security.kubernetes.io/enforce-version"] = "latest".into();
        }
        let ns: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}
        }))
        .expect("a Namespace");
        Api::<Namespace>::all(self.cluster.admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("the namespace is created");
    }

    /// The chart installed into `ns` (restricted), its controller running in cluster from the product
    /// image: 2 replicas with leader election, watching `watch`, tolerating the node's taint. Waits for
    /// both pods to be Ready.
    async fn operator(&self, ns: &str, watch_ns: &str) -> InCluster {
        self.namespace(ns, true).await;
        // The namespace's name: cluster-scoped objects (the aggregated ClusterRoles) are named after it.
        let release = ns;
        let tolerations = format!(
            r#"tolerations=[{{"key":"{}","operator":"Exists","effect":"NoSchedule"}}]"#,
            self.taint
        );
        let env = format!(
            r#"extraEnv=[{{"name":"KUBERNETES_SERVICE_HOST","value":"{}"}},{{"name":"KUBERNETES_SERVICE_PORT","value":"{}"}}]"#,
            self.api_host, self.api_port
        );
        let allowed = format!(r#"aws.allowedEndpoints=["{}"]"#, self.endpoint);
        let watch = format!(r#"watchNamespaces=["{watch_ns}"]"#);
        let repo = format!("image.repository={}", self.image.0);
        let tag = format!("image.tag={}", self.image.1);
        self.cluster
            .helm_install(
                release,
                ns,
                &[
                    "--set",
                    "image.registry=localhost",
                    "--set",
                    &repo,
                    "--set",
                    &tag,
                    "--set",
                    "replicaCount=2",
                    "--set",
                    "aws.region=us-east-1",
                    "--set-json",
                    r#"logLevel="info,qc=debug""#,
                    "--set-json",
                    &tolerations,
                    "--set-json",
                    &env,
                    "--set-json",
                    &allowed,
                    "--set-json",
                    &watch,
                ],
            )
            .await;
        let op = InCluster {
            release: release.to_string(),
            watch: watch_ns.to_string(),
            kubeconfig: self.cluster.kubeconfig.clone(),
            ns: ns.to_string(),
            fullname: format!("{release}-queue-consumer-operator"),
        };
        let pods: Api<Pod> = Api::namespaced(self.cluster.admin.clone(), ns);
        eventually(
            180,
            "both controller pods Ready",
            || self.describe(ns),
            || async {
                let list = pods.list(&ListParams::default()).await.ok()?;
                (list.items.iter().filter(|p| ready(p)).count() == 2).then_some(())
            },
        )
        .await;
        op
    }

    /// Pods, Deployments, Events and QueueConsumer conditions of `ns`, and the last lines of the
    /// controllers' logs, for a failure's message.
    fn describe(&self, ns: &str) -> String {
        let kubectl = |args: &[&str]| match std::process::Command::new(cluster::tool("kubectl"))
            .args(args)
            .env("KUBECONFIG", &self.cluster.kubeconfig)
            .output()
        {
            Ok(o) => format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => format!("kubectl: {e}"),
        };
        let mut out = kubectl(&["get", "pods,deployments,events", "-n", ns, "-o", "wide"]);
        out += &kubectl(&[
            "get",
            "queueconsumers",
            "-n",
            ns,
            "-o",
            "jsonpath={range .items[*].status.conditions[*]}{.type}={.status} {.reason}: {.message}{\"\\n\"}{end}",
        ]);
        let op_namespaces = kubectl(&[
            "get",
            "pods",
            "--all-namespaces",
            "-l",
            "app.kubernetes.io/component=controller",
            "-o",
            "jsonpath={.items[*].metadata.namespace}",
        ]);
        for op_ns in op_namespaces.split_whitespace().collect::<BTreeSet<_>>() {
            out += &kubectl(&[
                "logs",
                "-n",
                op_ns,
                "-l",
                "app.kubernetes.io/component=controller",
                "--tail=15",
                "--prefix",
            ]);
        }
        out
    }

    /// A QueueConsumer `name` in `ns` on `url`: the test handler's image over HTTP on 8080 (it appends
    /// each message id to `seen`/ids), concurrency 10, 0 to `max` replicas, polled every second, idle
    /// replicas let go after 5 s, no alarm.
    fn consumer(&self, ns: &str, name: &str, url: &str, seen: &Path, max: u32) -> Value {
        common::fixture::consumer(name)
            .namespace(ns)
            .queue_url(url)
            .endpoint(&self.endpoint)
            .set("/spec/queue/region", "us-east-1")
            .timeout("10s")
            .wait_time("1s")
            .concurrency(10)
            .http(8080, "/")
            .alarm(false)
            .scaling(json!({
                "minReplicas": 0, "maxReplicas": max, "pollInterval": "1s", "scaleDownStabilization": "5s"
            }))
            .set(
                "/spec/template/spec/containers",
                json!([{
                    "name": "handler",
                    "image": self.handler_image,
                    "imagePullPolicy": "IfNotPresent",
                    "volumeMounts": [{"name": "seen", "mountPath": "/seen"}],
                    "securityContext": {
                        "allowPrivilegeEscalation": false, "runAsNonRoot": true, "runAsUser": 65532,
                        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}
                    }
                }]),
            )
            .set(
                "/spec/template/spec/volumes",
                json!([{"name": "seen", "hostPath": {"path": seen.to_str().expect("utf-8"), "type": "Directory"}}]),
            )
            .set(
                "/spec/template/spec/tolerations",
                json!([{"key": self.taint, "operator": "Exists", "effect": "NoSchedule"}]),
            )
            .json()
    }

    async fn apply(&self, ns: &str, doc: &Value) {
        let name = doc["metadata"]["name"].as_str().expect("a name");
        Api::<QueueConsumer>::namespaced(self.cluster.admin.clone(), ns)
            .patch(name, &PatchParams::apply("node-test"), &Patch::Apply(doc))
            .await
            .expect("the QueueConsumer applies");
    }

    /// (spec.replicas, Ready pods) of the worker Deployment `name` in `ns`.
    async fn workers(&self, ns: &str, name: &str) -> Option<(i32, usize)> {
        let deploy = Api::<Deployment>::namespaced(self.cluster.admin.clone(), ns)
            .get_opt(name)
            .await
            .ok()??;
        let replicas = deploy.spec.replicas.unwrap_or(1);
        Some((
            replicas,
            self.worker_pods(ns, name)
                .await
                .iter()
                .filter(|p| ready(p))
                .count(),
        ))
    }

    /// The pods of the worker Deployment `name` that are not being deleted.
    async fn worker_pods(&self, ns: &str, name: &str) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.cluster.admin.clone(), ns);
        let selector = format!("app.kubernetes.io/instance={name}");
        pods.list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect()
    }
}

/// The operator's release in its namespace, and the namespace of the workers it watches: uninstalled and
/// deleted when dropped (a failed scenario leaves nothing running for the next).
struct InCluster {
    release: String,
    ns: String,
    fullname: String,
    watch: String,
    kubeconfig: String,
}

impl Drop for InCluster {
    fn drop(&mut self) {
        let run = |tool: &str, args: &[&str]| {
            let _ = std::process::Command::new(cluster::tool(tool))
                .args(args)
                .env("KUBECONFIG", &self.kubeconfig)
                .stdin(std::process::Stdio::null())
                .output();
        };
        run(
            "kubectl",
            &["delete", "namespace", &self.watch, "--wait=false"],
        );
        run(
            "helm",
            &[
                "uninstall",
                &self.release,
                "--namespace",
                &self.ns,
                "--wait=false",
            ],
        );
        run(
            "kubectl",
            &["delete", "namespace", &self.ns, "--wait=false"],
        );
    }
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A directory on the node (this machine) the handler's uid may append to.
fn seen_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("qc-node-seen-")
        .tempdir()
        .expect("a temporary directory");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// How many times the handler saw each message id.
fn seen(dir: &Path) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for id in std::fs::read_to_string(dir.join("ids"))
        .unwrap_or_default()
        .lines()
    {
        *counts.entry(id.to_string()).or_insert(0) += 1;
    }
    counts
}

/// A queue with a DLQ (maxReceiveCount 5, visibility 30 s) on the node's moto: (queue, DLQ).
async fn queues(sqs: &aws_sdk_sqs::Client, prefix: &str) -> (String, String) {
    let dlq = common::create_queue(
        sqs,
        &common::unique_name(&format!("{prefix}-dlq")),
        &[(A::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let arn = common::queue_arn(sqs, &dlq).await;
    let url = common::create_queue(
        sqs,
        &common::unique_name(prefix),
        &[
            (A::VisibilityTimeout, "30".into()),
            (
                A::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
            ),
        ],
    )
    .await;
    (url, dlq)
}

/// Sends `bodies`, ten a batch; their message ids.
async fn send(sqs: &aws_sdk_sqs::Client, url: &str, bodies: &[String]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for chunk in bodies.chunks(10) {
        let entries = chunk
            .iter()
            .enumerate()
            .map(|(i, b)| {
                SendMessageBatchRequestEntry::builder()
                    .id(format!("m{i}"))
                    .message_body(b)
                    .build()
                    .expect("an entry")
            })
            .collect::<Vec<_>>();
        let out = sqs
            .send_message_batch()
            .queue_url(url)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("send a batch");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        ids.extend(out.successful.into_iter().map(|s| s.message_id));
    }
    ids
}

/// (visible, in flight) of a queue.
async fn counts(sqs: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
    let out = sqs
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(A::ApproximateNumberOfMessages)
        .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .expect("queue attributes");
    let attrs = out.attributes.unwrap_or_default();
    let get = |k: &A| {
        attrs
            .get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or(u64::MAX)
    };
    (
        get(&A::ApproximateNumberOfMessages),
        get(&A::ApproximateNumberOfMessagesNotVisible),
    )
}

/// What the handler noted in the file `name` (`receipts`: a handling finished, `started`: one began):
/// each message id with its (receive count, pod) per handling.
fn notes(dir: &Path, name: &str) -> BTreeMap<String, Vec<(u32, String)>> {
    let mut out: BTreeMap<String, Vec<(u32, String)>> = BTreeMap::new();
    for line in std::fs::read_to_string(dir.join(name))
        .unwrap_or_default()
        .lines()
    {
        let mut parts = line.split(' ');
        let (Some(id), Some(count), Some(pod)) = (parts.next(), parts.next(), parts.next()) else {
            panic!("a malformed line in {name}: {line:?}");
        };
        let count = count
            .parse()
            .unwrap_or_else(|_| panic!("a receive count in {line:?}"));
        out.entry(id.to_string())
            .or_default()
            .push((count, pod.to_string()));
    }
    out
}

/// Every message of `sent` handled exactly once, nothing else handled, and no handling cut short (each
/// start has its finish, same receive and pod). The test's moto makes receives atomic
/// (scripts/moto-atomic-receive.py), so a second handling is the product's. Returns how many messages were
/// received more than once before their one handling (released by a stopping worker, say).
fn assert_handled_once(dir: &Path, sent: &BTreeSet<String>) -> usize {
    let done = notes(dir, "receipts");
    let started = notes(dir, "started");
    let missing: Vec<_> = sent.iter().filter(|id| !done.contains_key(*id)).collect();
    assert!(
        missing.is_empty(),
        "{} never handled: {missing:?}",
        missing.len()
    );
    let foreign: Vec<_> = done.keys().filter(|id| !sent.contains(*id)).collect();
    assert!(foreign.is_empty(), "handled but never sent: {foreign:?}");
    let twice: Vec<_> = done.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "handled more than once (receive count, pod): {twice:?}"
    );
    let cut: Vec<_> = started
        .iter()
        .flat_map(|(id, hs)| hs.iter().map(move |h| (id, h)))
        .filter(|(id, h)| !done.get(*id).is_some_and(|d| d.contains(h)))
        .collect();
    assert!(
        cut.is_empty(),
        "handlings begun and never finished (cut short): {cut:?}"
    );
    done.values().filter(|h| h[0].0 > 1).count()
}

fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
}

/// (a) 2,000 messages on an idle consumer at minReplicas 0: the Deployment scales from zero, the pods
/// consume, drain, and it scales back to zero; every message handled exactly once, the queue and the DLQ
/// empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scales_from_zero_drains_and_returns_to_zero() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("scales_from_zero_drains_and_returns_to_zero").await else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-a"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, dlq) = queues(&sqs, "node-a").await;
    let seen_at = seen_dir();
    node.apply(&ns, &node.consumer(&ns, "orders", &url, seen_at.path(), 3))
        .await;

    // Reconciled by the controller in cluster, idle: the Deployment exists at zero replicas.
    eventually(
        90,
        "an idle Deployment at 0 replicas",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (0, 0)).then_some(()) },
    )
    .await;
    let lease: Api<Lease> = Api::namespaced(node.cluster.admin.clone(), &op.ns);
    let leader = holder(&lease.get(&op.fullname).await.expect("the Lease")).expect("a leader");
    assert!(
        leader.starts_with(&op.fullname),
        "the Lease is held by a controller pod: {leader}"
    );

    let bodies: Vec<String> = (0..2000).map(|i| format!("message {i}")).collect();
    // Ten first: the time from zero to the first handling; then the rest while the worker consumes.
    let started = Instant::now();
    let mut sent = send(&sqs, &url, &bodies[..10]).await;
    eventually(
        120,
        "scaled from zero: a Ready worker pod",
        || node.describe(&ns),
        || async {
            let (replicas, ready) = node.workers(&ns, "orders").await?;
            (replicas >= 1 && ready >= 1).then_some(())
        },
    )
    .await;
    let ready_after = started.elapsed().as_secs_f64();
    eventually(
        60,
        "the first message handled",
        || node.describe(&ns),
        || async { (!seen(seen_at.path()).is_empty()).then_some(()) },
    )
    .await;
    eprintln!(
        "from zero: a worker Ready {ready_after:.1} s and the first message handled {:.1} s after it was sent",
        started.elapsed().as_secs_f64()
    );
    sent.extend(send(&sqs, &url, &bodies[10..]).await);
    assert_eq!(sent.len(), 2000);
    let peak = std::sync::atomic::AtomicI32::new(0);
    eventually(
        600,
        "all 2,000 messages handled",
        || {
            format!(
                "{} seen\n{}",
                seen(seen_at.path()).len(),
                node.describe(&ns)
            )
        },
        || async {
            if let Some((replicas, _)) = node.workers(&ns, "orders").await {
                peak.fetch_max(replicas, std::sync::atomic::Ordering::Relaxed);
            }
            (seen(seen_at.path()).len() >= sent.len()).then_some(())
        },
    )
    .await;
    eprintln!(
        "peak replicas {}",
        peak.load(std::sync::atomic::Ordering::Relaxed)
    );
    eventually(
        180,
        "scaled back to zero, every pod gone",
        || node.describe(&ns),
        || async {
            (node.workers(&ns, "orders").await? == (0, 0)
                && node.worker_pods(&ns, "orders").await.is_empty())
            .then_some(())
        },
    )
    .await;
    eprintln!(
        "drained in {:.1} s, back to zero",
        started.elapsed().as_secs_f64()
    );
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received more than once before their handling");
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    // Still once each with the queue empty: nothing came back for a second handling meanwhile.
    assert_handled_once(seen_at.path(), &sent);
    drop(op);
}

/// The Events of the QueueConsumer `name` in `ns` with `reason`: (note, reporting instance), oldest first.
async fn events(node: &Node, ns: &str, name: &str, reason: &str) -> Vec<(String, String)> {
    let api: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(node.cluster.admin.clone(), ns);
    let mut list: Vec<_> = api
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("QueueConsumer")
        })
        .collect();
    list.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
    list.into_iter()
        .map(|e| {
            (
                e.note.unwrap_or_default(),
                e.reporting_instance.unwrap_or_default(),
            )
        })
        .collect()
}

/// SIGKILL to the container `container` of `pod`, through the node's containerd: the process dies as in
/// a crash, the kubelet restarts it in the same pod.
fn kill_container(pod: &Pod, container: &str) {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == container))
        .and_then(|c| c.container_id.clone())
        .and_then(|id| id.strip_prefix("containerd://").map(str::to_string))
        .unwrap_or_else(|| {
            panic!(
                "no running {container} container in {:?}",
                pod.metadata.name
            )
        });
    let run = std::env::var("QC_TEST_CLUSTER_RUN_DIR").expect("QC_TEST_CLUSTER_RUN_DIR");
    let socket = format!("{run}/node/containerd/containerd.sock");
    let out = std::process::Command::new("ctr")
        .args([
            "-a", &socket, "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", &id,
        ])
        .output()
        .expect("ctr runs");
    assert!(
        out.status.success(),
        "ctr tasks kill {id}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// (c) `kubectl delete pod` of a busy worker: its in-flight messages finish (the handler outlives the
/// worker's drain), what it had received but not begun is released, the ReplicaSet's replacement takes the
/// rest; every message handled exactly once, none cut short, nothing in the DLQ.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_busy_worker_pod_loses_nothing_and_cuts_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("deleting_a_busy_worker_pod_loses_nothing_and_cuts_nothing").await else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-c"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, dlq) = queues(&sqs, "node-c").await;
    let seen_at = seen_dir();
    let mut doc = node.consumer(&ns, "orders", &url, seen_at.path(), 1);
    doc["spec"]["scaling"]["minReplicas"] = 1.into();
    node.apply(&ns, &doc).await;
    eventually(
        120,
        "one Ready worker",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (1, 1)).then_some(()) },
    )
    .await;
    // 60 messages of 2 s each at concurrency 10: about 12 s of work for the one pod.
    let bodies: Vec<String> = (0..60).map(|i| format!("slow {i}")).collect();
    let sent = send(&sqs, &url, &bodies).await;
    // Deleted while handlings are under way: the second ten begun, not finished.
    let (done_then, begun_then) = eventually(
        60,
        "ten handled, more in flight",
        || node.describe(&ns),
        || async {
            let done = seen(seen_at.path()).len();
            let begun: usize = notes(seen_at.path(), "started")
                .values()
                .map(Vec::len)
                .sum();
            (done >= 10 && begun >= done + 5).then_some((done, begun))
        },
    )
    .await;
    let busy = node.worker_pods(&ns, "orders").await;
    assert_eq!(busy.len(), 1);
    let busy_name = busy[0].metadata.name.clone().expect("a name");
    Api::<Pod>::namespaced(node.cluster.admin.clone(), &ns)
        .delete(&busy_name, &DeleteParams::default())
        .await
        .expect("delete the busy pod");
    eventually(
        240,
        "all 60 handled",
        || {
            format!(
                "{} seen\n{}",
                seen(seen_at.path()).len(),
                node.describe(&ns)
            )
        },
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    let again = assert_handled_once(seen_at.path(), &sent);
    let by_pod = notes(seen_at.path(), "receipts").values().fold(
        BTreeMap::<String, usize>::new(),
        |mut m, h| {
            *m.entry(h[0].1.clone()).or_default() += 1;
            m
        },
    );
    eprintln!(
        "{} begun and not finished ({done_then} finished) when {busy_name} was deleted; handled by pod: \
         {by_pod:?}; {again} received again before their handling",
        begun_then - done_then
    );
    assert!(
        by_pod.contains_key(&busy_name),
        "the deleted pod handled some"
    );
    assert!(
        by_pod.len() >= 2,
        "its replacement handled the rest: {by_pod:?}"
    );
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    // Still once each with the queue empty: nothing came back for a second handling meanwhile.
    assert_handled_once(seen_at.path(), &sent);
    drop(op);
}

/// (f) The leading controller pod's process killed (SIGKILL through containerd) while a backlog drains:
/// the other replica takes the Lease over, and scaling goes on under it (the scale back to zero is its);
/// every message handled exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_leading_controller_hands_scaling_over() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("killing_the_leading_controller_hands_scaling_over").await else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-f"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, dlq) = queues(&sqs, "node-f").await;
    let seen_at = seen_dir();
    node.apply(&ns, &node.consumer(&ns, "orders", &url, seen_at.path(), 3))
        .await;
    eventually(
        90,
        "an idle Deployment at 0 replicas",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (0, 0)).then_some(()) },
    )
    .await;
    // A backlog that takes a while: 400 messages, one in ten slow.
    let bodies: Vec<String> = (0..400)
        .map(|i| {
            if i % 10 == 0 {
                format!("slow {i}")
            } else {
                format!("message {i}")
            }
        })
        .collect();
    let sent = send(&sqs, &url, &bodies).await;
    eventually(
        120,
        "scaled from zero",
        || node.describe(&ns),
        || async {
            let (replicas, ready) = node.workers(&ns, "orders").await?;
            (replicas >= 1 && ready >= 1).then_some(())
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(node.cluster.admin.clone(), &op.ns);
    let leader = holder(&leases.get(&op.fullname).await.expect("the Lease")).expect("a leader");
    let pods: Api<Pod> = Api::namespaced(node.cluster.admin.clone(), &op.ns);
    let leader_pod = pods
        .get(&leader)
        .await
        .expect("the leader is a pod of the release");
    // Killed as a crash would (SIGKILL: its Lease is not given up), and its pod removed at once so it
    // does not come back under the same identity: the standby must wait the claim out.
    let killed = Instant::now();
    kill_container(&leader_pod, "qc-operator");
    pods.delete(&leader, &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the leader's pod");
    let next = eventually(
        60,
        "another controller holds the Lease",
        || node.describe(&op.ns),
        || async {
            let h = holder(&leases.get(&op.fullname).await.ok()?)?;
            (h != leader).then_some(h)
        },
    )
    .await;
    eprintln!(
        "{next} took the Lease over {:.1} s after {leader} was killed",
        killed.elapsed().as_secs_f64()
    );
    eventually(
        300,
        "all 400 handled",
        || {
            format!(
                "{} seen\n{}",
                seen(seen_at.path()).len(),
                node.describe(&ns)
            )
        },
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    eventually(
        180,
        "scaled back to zero",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (0, 0)).then_some(()) },
    )
    .await;
    let scaled = events(&node, &ns, "orders", "Scaled").await;
    let last = scaled.last().expect("Scaled events");
    assert!(
        last.0.contains("to 0"),
        "the last scale is to zero: {last:?}"
    );
    assert_eq!(
        last.1, next,
        "the scale to zero is the new leader's: {scaled:?}"
    );
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received again before their handling");
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    // Still once each with the queue empty: nothing came back for a second handling meanwhile.
    assert_handled_once(seen_at.path(), &sent);
    drop(op);
}

/// The condition `type_` of the QueueConsumer `name`: (status, reason).
async fn condition(node: &Node, ns: &str, name: &str, type_: &str) -> Option<(String, String)> {
    let qc = Api::<QueueConsumer>::namespaced(node.cluster.admin.clone(), ns)
        .get(name)
        .await
        .ok()?;
    qc.status?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// The worker pods' `controller.kubernetes.io/pod-deletion-cost` (None: not set).
fn deletion_cost(pod: &Pod) -> Option<i64> {
    pod.metadata
        .annotations
        .as_ref()?
        .get("controller.kubernetes.io/pod-deletion-cost")?
        .parse()
        .ok()
}

/// (b) Scale-in while messages are in flight: three busy replicas, then the backlog runs out and the
/// controller scales in step by step. Each pod the ReplicaSet removes is one the controller gave the lowest
/// pod-deletion-cost (its in-flight count) among the running ones; what the removed pods had in hand
/// finishes or is released: every message handled exactly once, none cut short.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_in_removes_the_least_busy_pods_and_cuts_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("scale_in_removes_the_least_busy_pods_and_cuts_nothing").await else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-b"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, dlq) = queues(&sqs, "node-b").await;
    let seen_at = seen_dir();
    let mut doc = node.consumer(&ns, "orders", &url, seen_at.path(), 3);
    // Declared as what it is (2 s a message), so three replicas are what the backlog asks for.
    doc["spec"]["processing"]["p99"] = "3s".into();
    doc["spec"]["scaling"]["maxBacklogAge"] = "20s".into();
    node.apply(&ns, &doc).await;
    eventually(
        90,
        "an idle Deployment at 0 replicas",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (0, 0)).then_some(()) },
    )
    .await;
    // The last one lingers 8 s (within the 10 s timeout): when the backlog is gone one pod still has it in hand while the others
    // are idle, and the scale-in must keep that pod.
    let mut bodies: Vec<String> = (0..240).map(|i| format!("slow {i}")).collect();
    bodies.push("linger 240".to_string());
    let sent = send(&sqs, &url, &bodies).await;
    eventually(
        120,
        "three Ready replicas",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (3, 3)).then_some(()) },
    )
    .await;
    // Every pod the ReplicaSet takes away while others run: its cost and theirs, from one list.
    let pods: Api<Pod> = Api::namespaced(node.cluster.admin.clone(), &ns);
    let selector = "app.kubernetes.io/instance=orders".to_string();
    let mut removed: BTreeMap<String, (Option<i64>, Vec<Option<i64>>)> = BTreeMap::new();
    let mut story: Vec<String> = Vec::new();
    let t0 = Instant::now();
    let deadline = t0 + std::time::Duration::from_secs(300);
    loop {
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let survivors: Vec<Option<i64>> = list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .map(deletion_cost)
            .collect();
        for p in list
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
        {
            let name = p.metadata.name.clone().expect("a name");
            if !removed.contains_key(&name) {
                let pods: Vec<_> = list
                    .iter()
                    .map(|p| {
                        format!(
                            "{} cost {:?} ready {} deleting {} rs {:?}",
                            p.metadata.name.as_deref().unwrap_or("?"),
                            deletion_cost(p),
                            ready(p),
                            p.metadata.deletion_timestamp.is_some(),
                            p.metadata
                                .labels
                                .as_ref()
                                .and_then(|l| l.get("pod-template-hash"))
                        )
                    })
                    .collect();
                story.push(format!(
                    "{:.1} s: {name} removed; {pods:?}",
                    t0.elapsed().as_secs_f64()
                ));
            }
            removed
                .entry(name)
                .or_insert_with(|| (deletion_cost(p), survivors.clone()));
        }
        if seen(seen_at.path()).len() >= sent.len() && list.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not drained and scaled to zero within 300 s: {} seen\n{}",
            seen(seen_at.path()).len(),
            node.describe(&ns)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "removed pods (their cost, the survivors' costs then): {removed:?}\n{}",
        story.join("\n")
    );
    let mut checked = 0;
    for (name, (cost, survivors)) in &removed {
        if survivors.is_empty() {
            continue; // the last ones, to zero: nothing to compare with
        }
        let cost = cost.unwrap_or_else(|| panic!("{name} was removed with no deletion cost set"));
        for s in survivors {
            let s = s.unwrap_or(i64::MAX);
            assert!(
                cost <= s,
                "{name} (cost {cost}) went before a pod of cost {s}: {removed:?}"
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 1,
        "no scale-in with pods left running was seen: {removed:?}"
    );
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received again before their handling");
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    // Still once each with the queue empty: nothing came back for a second handling meanwhile.
    assert_handled_once(seen_at.path(), &sent);
    drop(op);
}

/// (d) The handler's dependency down for 60 s (every call answers 503): the workers' breakers open,
/// `HandlerHealthy` turns False, the controller holds the replicas it had (no scale-out onto the
/// failing dependency), nothing reaches the DLQ; once the dependency is back every message is handled
/// exactly once and `HandlerHealthy` is True again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dependency_down_for_a_minute_holds_replicas_and_dead_letters_nothing() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) =
        node("a_dependency_down_for_a_minute_holds_replicas_and_dead_letters_nothing").await
    else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-d"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, dlq) = queues(&sqs, "node-d").await;
    let seen_at = seen_dir();
    let mut doc = node.consumer(&ns, "orders", &url, seen_at.path(), 3);
    doc["spec"]["scaling"]["minReplicas"] = 1.into();
    node.apply(&ns, &doc).await;
    eventually(
        120,
        "one Ready worker",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (1, 1)).then_some(()) },
    )
    .await;
    std::fs::write(seen_at.path().join("down"), b"").expect("the dependency goes down");
    let down = Instant::now();
    // A backlog three replicas would be asked for, were the handler healthy.
    let bodies: Vec<String> = (0..1500).map(|i| format!("message {i}")).collect();
    let sent = send(&sqs, &url, &bodies).await;
    eventually(
        60,
        "HandlerHealthy False",
        || node.describe(&ns),
        || async {
            let (status, _) = condition(&node, &ns, "orders", "HandlerHealthy").await?;
            (status == "False").then_some(())
        },
    )
    .await;
    let unhealthy_after = down.elapsed().as_secs_f64();
    let mut most = 0;
    while down.elapsed() < std::time::Duration::from_secs(60) {
        if let Some((replicas, _)) = node.workers(&ns, "orders").await {
            most = most.max(replicas);
        }
        assert_eq!(
            counts(&sqs, &dlq).await,
            (0, 0),
            "dead-lettered during the outage"
        );
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    std::fs::remove_file(seen_at.path().join("down")).expect("the dependency comes back");
    eprintln!(
        "HandlerHealthy False {unhealthy_after:.1} s into the outage; at most {most} replicas during it"
    );
    assert!(
        most <= 1,
        "scaled out onto a failing dependency: {most} replicas"
    );
    assert!(
        seen(seen_at.path()).is_empty(),
        "handled while the dependency was down"
    );
    eventually(
        300,
        "all 1,500 handled after the recovery",
        || {
            format!(
                "{} seen\n{}",
                seen(seen_at.path()).len(),
                node.describe(&ns)
            )
        },
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    eventually(
        60,
        "HandlerHealthy True again",
        || node.describe(&ns),
        || async {
            let (status, _) = condition(&node, &ns, "orders", "HandlerHealthy").await?;
            (status == "True").then_some(())
        },
    )
    .await;
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!(
        "recovered in {:.1} s; {again} received again before their handling",
        down.elapsed().as_secs_f64() - 60.0
    );
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    // Still once each with the queue empty: nothing came back for a second handling meanwhile.
    assert_handled_once(seen_at.path(), &sent);
    drop(op);
}

/// A tag of the test handler's image for a rollout, made in the node's containerd (nothing is pulled).
fn tag_handler_image(node: &Node, tag: &str) -> String {
    let run = std::env::var("QC_TEST_CLUSTER_RUN_DIR").expect("QC_TEST_CLUSTER_RUN_DIR");
    let socket = format!("{run}/node/containerd/containerd.sock");
    let repo = node
        .handler_image
        .rsplit_once(':')
        .map_or(node.handler_image.as_str(), |(r, _)| r);
    let target = format!("{repo}:{tag}");
    let out = std::process::Command::new("ctr")
        .args([
            "-a",
            &socket,
            "-n",
            "k8s.io",
            "images",
            "tag",
            "--force",
            &node.handler_image,
            &target,
        ])
        .output()
        .expect("ctr runs");
    assert!(
        out.status.success(),
        "ctr images tag: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    target
}

/// The ReplicaSet hash in a worker pod's name (orders-HASH-SUFFIX).
fn pod_hash(pod: &str) -> &str {
    pod.rsplit('-').nth(1).unwrap_or(pod)
}

/// (e) A rollout of a new handler image under load: the old pods drain and go, the new ones take over;
/// no message lost or handled twice, and the QueueConsumer's Ready follows the rollout (False with
/// RollingOut while it runs, True once every pod runs the new image).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_under_load_loses_nothing_and_ready_follows_it() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) = node("a_rollout_under_load_loses_nothing_and_ready_follows_it").await else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-e"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let (url, dlq) = queues(&sqs, "node-e").await;
    let seen_at = seen_dir();
    let mut doc = node.consumer(&ns, "orders", &url, seen_at.path(), 2);
    doc["spec"]["scaling"]["minReplicas"] = 2.into();
    node.apply(&ns, &doc).await;
    eventually(
        120,
        "two Ready workers",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (2, 2)).then_some(()) },
    )
    .await;
    let bodies: Vec<String> = (0..600)
        .map(|i| {
            if i % 5 == 0 {
                format!("slow {i}")
            } else {
                format!("message {i}")
            }
        })
        .collect();
    let sent = send(&sqs, &url, &bodies).await;
    eventually(
        60,
        "50 handled",
        || node.describe(&ns),
        || async { (seen(seen_at.path()).len() >= 50).then_some(()) },
    )
    .await;
    let v2 = tag_handler_image(&node, &format!("rollout-{}", std::process::id()));
    doc["spec"]["template"]["spec"]["containers"][0]["image"] = v2.clone().into();
    node.apply(&ns, &doc).await;
    let rolled = Instant::now();
    // Ready as the rollout goes: every (status, reason) it shows, in order.
    let mut ready_seen: Vec<(String, String)> = Vec::new();
    let deadline = rolled + std::time::Duration::from_secs(240);
    loop {
        if let Some(r) = condition(&node, &ns, "orders", "Ready").await
            && ready_seen.last() != Some(&r)
        {
            ready_seen.push(r);
        }
        let pods = node.worker_pods(&ns, "orders").await;
        let all_new = pods.len() == 2
            && pods.iter().all(|p| {
                ready(p)
                    && p.spec.as_ref().is_some_and(|s| {
                        s.containers
                            .iter()
                            .any(|c| c.image.as_deref() == Some(v2.as_str()))
                    })
            });
        let leaving = Api::<Pod>::namespaced(node.cluster.admin.clone(), &ns)
            .list(&ListParams::default().labels("app.kubernetes.io/instance=orders"))
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        if all_new && leaving == 2 && ready_seen.last().is_some_and(|(s, _)| s == "True") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the rollout did not complete within 240 s; Ready went {ready_seen:?}\n{}",
            node.describe(&ns)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    eprintln!(
        "rolled out in {:.1} s; Ready went {ready_seen:?}",
        rolled.elapsed().as_secs_f64()
    );
    assert!(
        ready_seen
            .iter()
            .any(|(s, r)| s == "False" && r == "RollingOut"),
        "Ready never said RollingOut during the rollout: {ready_seen:?}"
    );
    eventually(
        240,
        "all 600 handled",
        || {
            format!(
                "{} seen\n{}",
                seen(seen_at.path()).len(),
                node.describe(&ns)
            )
        },
        || async { (seen(seen_at.path()).len() >= sent.len()).then_some(()) },
    )
    .await;
    let hashes: BTreeSet<String> = notes(seen_at.path(), "receipts")
        .values()
        .flatten()
        .map(|(_, pod)| pod_hash(pod).to_string())
        .collect();
    assert!(
        hashes.len() >= 2,
        "handled by the old and the new pods: {hashes:?}"
    );
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    let again = assert_handled_once(seen_at.path(), &sent);
    eprintln!("{again} received again before their handling");
    drop(op);
}

/// (g) The exec layout (qc-worker copied into the handler's own image, a process per message) on a FIFO
/// queue: six message groups, scaled from zero to several replicas and back; within each group the
/// messages are handled in the order sent, each exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_layout_on_a_fifo_queue_keeps_each_groups_order_across_scaling() {
    let _one = ONE_AT_A_TIME.lock().await;
    let Some(node) =
        node("exec_layout_on_a_fifo_queue_keeps_each_groups_order_across_scaling").await
    else {
        return;
    };
    let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique("node-g"));
    node.namespace(&ns, false).await;
    let op = node.operator(&op_ns, &ns).await;
    let sqs = node.sqs().await;
    let dlq = common::create_queue(
        &sqs,
        &format!("{}.fifo", common::unique_name("node-g-dlq")),
        &[
            (A::FifoQueue, "true".into()),
            (A::MessageRetentionPeriod, "1209600".into()),
        ],
    )
    .await;
    let arn = common::queue_arn(&sqs, &dlq).await;
    let url = common::create_queue(
        &sqs,
        &format!("{}.fifo", common::unique_name("node-g")),
        &[
            (A::FifoQueue, "true".into()),
            (A::VisibilityTimeout, "30".into()),
            (
                A::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
            ),
        ],
    )
    .await;
    let seen_at = seen_dir();
    let mut doc = node.consumer(&ns, "orders", &url, seen_at.path(), 3);
    doc["spec"]["handler"] = json!({"exec": {"command": ["/app/make-thumbnail"]}});
    doc["spec"]["processing"]["concurrency"] = 3.into();
    doc["spec"]["template"]["spec"]["containers"][0]["env"] =
        json!([{"name": "SEEN_FILE", "value": "/seen/ids"}]);
    node.apply(&ns, &doc).await;
    eventually(
        90,
        "an idle Deployment at 0 replicas",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (0, 0)).then_some(()) },
    )
    .await;
    // 6 groups of 40, interleaved as sent; each message's (group, place in its group) by its id.
    let mut order: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for i in 0..40 {
        let entries: Vec<_> = (0..6)
            .map(|g| {
                SendMessageBatchRequestEntry::builder()
                    .id(format!("g{g}"))
                    .message_body(format!("group {g} message {i}"))
                    .message_group_id(format!("g{g}"))
                    .message_deduplication_id(format!("g{g}-{i}"))
                    .build()
                    .expect("an entry")
            })
            .collect();
        let out = sqs
            .send_message_batch()
            .queue_url(&url)
            .set_entries(Some(entries))
            .send()
            .await
            .expect("send a batch");
        assert!(out.failed.is_empty(), "{:?}", out.failed);
        for s in out.successful {
            let g: usize = s.id[1..].parse().expect("a group");
            order.insert(s.message_id, (g, i));
        }
    }
    let sent: BTreeSet<String> = order.keys().cloned().collect();
    let peak = std::sync::atomic::AtomicI32::new(0);
    eventually(
        400,
        "all 240 handled",
        || {
            format!(
                "{} seen\n{}",
                seen(seen_at.path()).len(),
                node.describe(&ns)
            )
        },
        || async {
            if let Some((replicas, _)) = node.workers(&ns, "orders").await {
                peak.fetch_max(replicas, std::sync::atomic::Ordering::Relaxed);
            }
            (seen(seen_at.path()).len() >= sent.len()).then_some(())
        },
    )
    .await;
    eventually(
        180,
        "scaled back to zero",
        || node.describe(&ns),
        || async { (node.workers(&ns, "orders").await? == (0, 0)).then_some(()) },
    )
    .await;
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    // The receipts in the order they were written: per group, places must rise.
    let text = std::fs::read_to_string(seen_at.path().join("receipts")).expect("receipts");
    let mut last: BTreeMap<usize, usize> = BTreeMap::new();
    let mut pods = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split(' ');
        let id = parts.next().expect("an id");
        let pod = parts.nth(1).expect("a pod");
        pods.insert(pod.to_string());
        let (g, i) = order[id];
        if let Some(prev) = last.insert(g, i) {
            assert!(
                prev < i,
                "group {g}: message {i} handled after {prev}\n{text}"
            );
        }
    }
    eprintln!(
        "peak {peak} replicas, {} pods handled; each group in order",
        pods.len()
    );
    assert!(
        peak >= 2 && pods.len() >= 2,
        "no scale event: peak {peak}, pods {pods:?}"
    );
    eventually(60, "the queue empty", String::new, || async {
        (counts(&sqs, &url).await == (0, 0)).then_some(())
    })
    .await;
    assert_eq!(counts(&sqs, &dlq).await, (0, 0), "nothing dead-lettered");
    assert_handled_once(seen_at.path(), &sent);
    drop(op);
}
