//! The real node of scripts/k8s-node.sh for tests/node.rs and benches/node.rs: the chart installed with
//! its controller in cluster, QueueConsumers whose pods run the test handler's image on the node, and what
//! the handler noted of each message (tests/image/handler.rs), read back.
//!
//! In a cluster the pods' AWS credentials come from IRSA or EKS Pod Identity, whose webhook adds
//! environment variables to the pods; here a MutatingAdmissionPolicy (CEL, in the API server) adds moto's
//! test keys the same way to every container of the labelled namespaces. The node runs no kube-proxy: the
//! operator reaches the API server on the node's address (KUBERNETES_SERVICE_HOST/PORT in the chart's
//! extraEnv), the controller scrapes the workers by pod IP as it always does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use aws_sdk_sqs::types::{QueueAttributeName as A, SendMessageBatchRequestEntry};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use qc::api::QueueConsumer;
use serde_json::{Value, json};

use super::cluster::{self, Cluster, eventually};

/// Label of the namespaces whose pods get moto's keys from the admission policy.
pub const KEYS_LABEL: &str = "qc.test/aws-keys";

/// The node, its moto and the images imported into it.
pub struct Node {
    pub cluster: Cluster,
    /// moto on the node's address, which pods reach.
    pub endpoint: String,
    pub taint: String,
    /// The product image (operator and worker): (repository without `localhost/`, tag).
    pub image: (String, String),
    pub handler_image: String,
    pub api_host: String,
    pub api_port: String,
}

/// The node, or None after a loud skip message (a failure when `QC_REQUIRE_NODE=1`).
pub async fn node(test: &str) -> Option<Node> {
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
    pub async fn sqs(&self) -> aws_sdk_sqs::Client {
        let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&self.endpoint)).await;
        aws_sdk_sqs::Client::new(&conf)
    }

    /// A scenario named `name`: a workers' namespace and an operator of its own watching it, a queue with
    /// a DLQ, an empty notes directory.
    pub async fn scenario(&self, name: &str) -> Scenario {
        let (op_ns, ns) = (cluster::unique("node-op"), cluster::unique(name));
        self.namespace(&ns, false).await;
        let op = self.operator(&op_ns, &ns).await;
        let sqs = self.sqs().await;
        let (url, dlq) = queues(&sqs, name).await;
        Scenario {
            op,
            ns,
            sqs,
            url,
            dlq,
            seen: seen_dir(),
        }
    }

    /// Waits up to `secs` for the worker Deployment `orders` in `ns` to stand at `want` (replicas, Ready
    /// pods).
    pub async fn wait_workers(&self, ns: &str, want: (i32, usize), secs: u64) {
        eventually(
            secs,
            &format!("the workers at {want:?} (replicas, Ready)"),
            || self.describe(ns),
            || async { (self.workers(ns, "orders").await? == want).then_some(()) },
        )
        .await;
    }

    /// The admission policy that hands moto's keys to the pods of labelled namespaces (applied by every
    /// test; the apply is idempotent).
    pub fn keys_policy(&self) {
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
        // The API server applies a new policy once its informer has it: until a pod created in a
        // labelled namespace comes back with the keys (a server-side dry run), the first scenario's
        // controller pods could start without them.
        let probe_ns = "qc-node-keys-probe";
        let ns_doc = dir.path().join("probe-ns.yaml");
        std::fs::write(
            &ns_doc,
            format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {probe_ns}, labels: {{{KEYS_LABEL}: moto}}}}\n"),
        )
        .expect("write the probe namespace");
        self.cluster
            .run("kubectl", &["apply", "-f", ns_doc.to_str().expect("utf-8")]);
        let pod_doc = dir.path().join("probe-pod.yaml");
        std::fs::write(
            &pod_doc,
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: probe, namespace: {probe_ns}}}\n\
                 spec: {{containers: [{{name: c, image: probe}}]}}\n"
            ),
        )
        .expect("write the probe pod");
        let deadline = std::time::Instant::now() + std::time::Duration::from_mins(1);
        loop {
            let out = self.cluster.run(
                "kubectl",
                &[
                    "create",
                    "--dry-run=server",
                    "-o",
                    "json",
                    "-f",
                    pod_doc.to_str().expect("utf-8"),
                ],
            );
            if out.contains("AWS_ACCESS_KEY_ID") {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the MutatingAdmissionPolicy did not take effect within 60 s: {out}"
            );
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    }

    /// A namespace whose pods get moto's keys; `restricted`: enforcing the restricted profile.
    pub async fn namespace(&self, name: &str, restricted: bool) {
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
    pub async fn operator(&self, ns: &str, watch_ns: &str) -> InCluster {
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
    pub fn describe(&self, ns: &str) -> String {
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
    pub fn consumer(&self, ns: &str, name: &str, url: &str, seen: &Path, max: u32) -> Value {
        super::fixture::consumer(name)
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

    pub async fn apply(&self, ns: &str, doc: &Value) {
        let name = doc["metadata"]["name"].as_str().expect("a name");
        Api::<QueueConsumer>::namespaced(self.cluster.admin.clone(), ns)
            .patch(name, &PatchParams::apply("node-test"), &Patch::Apply(doc))
            .await
            .expect("the QueueConsumer applies");
    }

    /// (spec.replicas, Ready pods) of the worker Deployment `name` in `ns`.
    pub async fn workers(&self, ns: &str, name: &str) -> Option<(i32, usize)> {
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
    pub async fn worker_pods(&self, ns: &str, name: &str) -> Vec<Pod> {
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

/// One scenario's world: its own operator in cluster, the namespace of its workers, a queue with a DLQ on
/// the node's moto, and the directory of the handler's notes. Dropped: the operator uninstalled and both
/// namespaces deleted.
pub struct Scenario {
    pub op: InCluster,
    pub ns: String,
    pub sqs: aws_sdk_sqs::Client,
    pub url: String,
    pub dlq: String,
    pub seen: tempfile::TempDir,
}

impl Scenario {
    /// The queue empty (within 60 s), the DLQ empty, and every message of `sent` handled exactly once
    /// (checked with the queue empty: nothing came back for a second handling). Returns how many were
    /// received more than once before their one handling.
    pub async fn settled(&self, sent: &BTreeSet<String>) -> usize {
        eventually(60, "the queue empty", String::new, || async {
            (counts(&self.sqs, &self.url).await == (0, 0)).then_some(())
        })
        .await;
        assert_eq!(
            counts(&self.sqs, &self.dlq).await,
            (0, 0),
            "nothing dead-lettered"
        );
        assert_handled_once(self.seen.path(), sent)
    }
}

/// The operator's release in its namespace, and the namespace of the workers it watches: uninstalled and
/// deleted when dropped (a failed scenario leaves nothing running for the next).
pub struct InCluster {
    pub release: String,
    pub ns: String,
    pub fullname: String,
    pub watch: String,
    pub kubeconfig: String,
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

pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A directory on the node (this machine) the handler's uid may append to.
pub fn seen_dir() -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("qc-node-seen-")
        .tempdir()
        .expect("a temporary directory");
    std::fs::set_permissions(
        dir.path(),
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777),
    )
    .expect("chmod");
    dir
}

/// How many times the handler saw each message id.
pub fn seen(dir: &Path) -> BTreeMap<String, usize> {
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
pub async fn queues(sqs: &aws_sdk_sqs::Client, prefix: &str) -> (String, String) {
    let dlq = super::create_queue(
        sqs,
        &super::unique_name(&format!("{prefix}-dlq")),
        &[(A::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let arn = super::queue_arn(sqs, &dlq).await;
    let url = super::create_queue(
        sqs,
        &super::unique_name(prefix),
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
pub async fn send(sqs: &aws_sdk_sqs::Client, url: &str, bodies: &[String]) -> BTreeSet<String> {
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
pub async fn counts(sqs: &aws_sdk_sqs::Client, url: &str) -> (u64, u64) {
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
pub fn notes(dir: &Path, name: &str) -> BTreeMap<String, Vec<(u32, String)>> {
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

/// The handler's notes in `name` as written: (id, receive count, pod, Unix milliseconds).
pub fn timed_notes(dir: &Path, name: &str) -> Vec<(String, u32, String, u64)> {
    std::fs::read_to_string(dir.join(name))
        .unwrap_or_default()
        .lines()
        .map(|line| {
            let f: Vec<&str> = line.split(' ').collect();
            assert_eq!(f.len(), 4, "a line of {name}: {line:?}");
            let num =
                |s: &str| -> u64 { s.parse().unwrap_or_else(|_| panic!("a number in {line:?}")) };
            (
                f[0].to_string(),
                u32::try_from(num(f[1])).expect("a count"),
                f[2].to_string(),
                num(f[3]),
            )
        })
        .collect()
}

/// Every message of `sent` handled exactly once, nothing else handled, and no handling cut short (each
/// start has its finish, same receive and pod). The test's moto makes receives atomic
/// (scripts/moto-atomic-receive.py), so a second handling is the product's. Returns how many messages were
/// received more than once before their one handling (released by a stopping worker, say).
pub fn assert_handled_once(dir: &Path, sent: &BTreeSet<String>) -> usize {
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

pub fn holder(lease: &Lease) -> Option<String> {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone())
}

/// The Events of the QueueConsumer `name` in `ns` with `reason`: (note, reporting instance), oldest first.
pub async fn events(node: &Node, ns: &str, name: &str, reason: &str) -> Vec<(String, String)> {
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
pub fn kill_container(pod: &Pod, container: &str) {
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

/// The condition `type_` of the QueueConsumer `name`: (status, reason).
pub async fn condition(node: &Node, ns: &str, name: &str, type_: &str) -> Option<(String, String)> {
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
pub fn deletion_cost(pod: &Pod) -> Option<i64> {
    pod.metadata
        .annotations
        .as_ref()?
        .get("controller.kubernetes.io/pod-deletion-cost")?
        .parse()
        .ok()
}

/// A tag of the test handler's image for a rollout, made in the node's containerd (nothing is pulled).
pub fn tag_handler_image(node: &Node, tag: &str) -> String {
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
pub fn pod_hash(pod: &str) -> &str {
    pod.rsplit('-').nth(1).unwrap_or(pod)
}
