//! End to end on a real cluster: install the chart, run moto in the cluster, apply a QueueConsumer for a
//! queue with a dead-letter queue, and wait until it is Ready with its worker Deployment in place.
//!
//! It touches a cluster only when both KUBECONFIG and QC_E2E_IMAGE are set (a KUBECONFIG alone may point at
//! production); otherwise it prints why and passes. Variables (docs/install.md, "End-to-end test"):
//!   QC_E2E_IMAGE        image built from the Dockerfile that the cluster can pull (e.g. loaded into kind)
//!   QC_E2E_MOTO_IMAGE   moto server image, default motoserver/moto:latest
//!   QC_E2E_INSTALL_CRDS false when the CRD already exists (another release owns it), default true
//!   QC_E2E_KEEP=1       leave the namespaces for debugging

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use aws_sdk_sqs::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_sqs::types::QueueAttributeName;

const CHART: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/charts/queue-consumer-operator"
);
const MOTO_PORT: u16 = 5000;

struct Env {
    image: String,
    moto_image: String,
    install_crds: bool,
    keep: bool,
}

fn env() -> Result<Env, String> {
    if std::env::var_os("KUBECONFIG").is_none() {
        return Err("KUBECONFIG is not set".into());
    }
    let image = std::env::var("QC_E2E_IMAGE").map_err(|_| {
        "KUBECONFIG is set but QC_E2E_IMAGE is not (the image the cluster runs; see docs/install.md)"
            .to_string()
    })?;
    Ok(Env {
        image,
        moto_image: std::env::var("QC_E2E_MOTO_IMAGE")
            .unwrap_or_else(|_| "motoserver/moto:latest".into()),
        install_crds: std::env::var("QC_E2E_INSTALL_CRDS").as_deref() != Ok("false"),
        keep: std::env::var("QC_E2E_KEEP").as_deref() == Ok("1"),
    })
}

fn tool(name: &str) -> PathBuf {
    let cache = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/queue-consumer-operator/bin"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    cache
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} not found: source scripts/lib.sh and run ensure_helm"))
}

fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(tool(program));
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    if stdin.is_some() {
        cmd.stdin(Stdio::piped());
    }
    let mut child = cmd.spawn().unwrap();
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    child.wait_with_output().unwrap()
}

fn ok(program: &str, args: &[&str], stdin: Option<&str>) -> String {
    let out = run(program, args, stdin);
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

/// Deletes what the test created, in the order that lets the controller run its finalizer.
struct Cleanup {
    ns: String,
    moto_ns: String,
    release: String,
    keep: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.keep {
            eprintln!(
                "QC_E2E_KEEP=1: left namespaces {} and {}",
                self.ns, self.moto_ns
            );
            return;
        }
        let _ = run(
            "kubectl",
            &[
                "-n",
                &self.ns,
                "delete",
                "queueconsumers",
                "--all",
                "--wait",
                "--timeout=120s",
            ],
            None,
        );
        let _ = run(
            "helm",
            &["uninstall", &self.release, "-n", &self.ns, "--wait"],
            None,
        );
        for ns in [&self.ns, &self.moto_ns] {
            let _ = run(
                "kubectl",
                &["delete", "namespace", ns, "--wait=false"],
                None,
            );
        }
    }
}

struct PortForward(Child, u16);

impl PortForward {
    fn start(ns: &str, target: &str, port: u16) -> PortForward {
        let mut child = Command::new(tool("kubectl"))
            .args(["-n", ns, "port-forward", target, &format!("0:{port}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "Forwarding from 127.0.0.1:PORT -> 5000"
        let local = line
            .split_whitespace()
            .nth(2)
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("unexpected port-forward output: {line:?}"));
        PortForward(child, local)
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto_manifest(ns: &str, image: &str) -> String {
    format!(
        r"apiVersion: apps/v1
kind: Deployment
metadata: {{name: moto, namespace: {ns}}}
spec:
  selector: {{matchLabels: {{app: moto}}}}
  template:
    metadata: {{labels: {{app: moto}}}}
    spec:
      containers:
        - name: moto
          image: {image}
          ports: [{{containerPort: {MOTO_PORT}}}]
          readinessProbe: {{httpGet: {{path: /moto-api/, port: {MOTO_PORT}}}}}
---
apiVersion: v1
kind: Service
metadata: {{name: moto, namespace: {ns}}}
spec:
  selector: {{app: moto}}
  ports: [{{port: {MOTO_PORT}, targetPort: {MOTO_PORT}}}]
"
    )
}

/// A QueueConsumer that may scale to zero: with an empty queue, Ready needs the queue reachable, the
/// config valid and the (zero-replica) Deployment available, which is what an install must deliver.
fn consumer_manifest(ns: &str, name: &str, queue_url: &str, endpoint: &str, image: &str) -> String {
    format!(
        r#"apiVersion: sqs.consumers.dev/v1alpha1
kind: QueueConsumer
metadata: {{name: {name}, namespace: {ns}}}
spec:
  queue: {{url: "{queue_url}", region: us-east-1, endpoint: "{endpoint}"}}
  processing: {{p99: 1s, timeout: 10s, concurrency: 2, batchSize: 2}}
  # Never runs: the queue stays empty, so the Deployment stays at zero replicas.
  handler:
    exec: {{command: ["/usr/local/bin/qc-worker", "--version"]}}
  template:
    spec:
      containers:
        - name: handler
          image: {image}
  scaling: {{minReplicas: 0, maxReplicas: 1}}
  deadLetter: {{alarm: false}}
"#
    )
}

async fn create_queues(endpoint: &str, name: &str) {
    let conf = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .endpoint_url(endpoint)
        .credentials_provider(Credentials::new("testing", "testing", None, None, "e2e"))
        .http_client(qc::aws::http_client())
        .build();
    let sqs = aws_sdk_sqs::Client::from_conf(conf);
    let dlq = sqs
        .create_queue()
        .queue_name(format!("{name}-dlq"))
        .attributes(QueueAttributeName::MessageRetentionPeriod, "1209600")
        .send()
        .await
        .unwrap();
    let dlq_arn = sqs
        .get_queue_attributes()
        .queue_url(dlq.queue_url().unwrap())
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await
        .unwrap()
        .attributes()
        .unwrap()[&QueueAttributeName::QueueArn]
        .clone();
    let redrive = format!(r#"{{"deadLetterTargetArn":"{dlq_arn}","maxReceiveCount":"5"}}"#);
    sqs.create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::VisibilityTimeout, "30")
        .attributes(QueueAttributeName::RedrivePolicy, redrive)
        .send()
        .await
        .unwrap();
}

/// "repo:tag" or "repo@sha256:..." as chart values.
fn image_values(image: &str) -> Vec<String> {
    if let Some((repo, digest)) = image.split_once('@') {
        return vec![
            format!("image.repository={repo}"),
            format!("image.digest={digest}"),
        ];
    }
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => vec![
            format!("image.repository={repo}"),
            format!("image.tag={tag}"),
        ],
        _ => vec![format!("image.repository={image}")],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_installs_and_a_queue_consumer_becomes_ready() {
    let env = match env() {
        Ok(env) => env,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let ns = unique("qc-e2e");
    let moto_ns = format!("{ns}-moto");
    let release = "qc".to_string();
    let _cleanup = Cleanup {
        ns: ns.clone(),
        moto_ns: moto_ns.clone(),
        release: release.clone(),
        keep: env.keep,
    };

    // The operator's namespace enforces the restricted Pod Security Standard: its pods must pass admission.
    ok("kubectl", &["create", "namespace", &ns], None);
    ok(
        "kubectl",
        &[
            "label",
            "namespace",
            &ns,
            "pod-security.kubernetes.io/enforce=restricted",
        ],
        None,
    );
    // moto's image is not built for the restricted profile: it gets a namespace of its own.
    ok("kubectl", &["create", "namespace", &moto_ns], None);
    ok(
        "kubectl",
        &["apply", "-f", "-"],
        Some(&moto_manifest(&moto_ns, &env.moto_image)),
    );
    ok(
        "kubectl",
        &[
            "-n",
            &moto_ns,
            "rollout",
            "status",
            "deployment/moto",
            "--timeout=180s",
        ],
        None,
    );

    let queue = unique("orders");
    {
        let forward = PortForward::start(&moto_ns, "svc/moto", MOTO_PORT);
        create_queues(&format!("http://127.0.0.1:{}", forward.1), &queue).await;
    }
    let in_cluster = format!("http://moto.{moto_ns}.svc:{MOTO_PORT}");
    let queue_url = format!("{in_cluster}/123456789012/{queue}");

    let mut helm_args: Vec<String> = [
        "install",
        &release,
        CHART,
        "--namespace",
        &ns,
        "--wait",
        "--timeout",
        "3m",
        "--set",
        "aws.region=us-east-1",
        "--set-json",
        r#"env=[{"name":"AWS_ACCESS_KEY_ID","value":"testing"},{"name":"AWS_SECRET_ACCESS_KEY","value":"testing"}]"#,
        "--set",
        &format!("crds.install={}", env.install_crds),
        "--set-json",
        &format!(r#"watchNamespaces=["{ns}"]"#),
        // The in-cluster moto is a tenant-chosen endpoint: allowed explicitly, as an operator would.
        "--set-json",
        &format!(r#"aws.allowedEndpoints=["{in_cluster}"]"#),
    ]
    .iter()
    .map(std::string::ToString::to_string)
    .collect();
    for v in image_values(&env.image) {
        helm_args.push("--set".into());
        helm_args.push(v);
    }
    let helm_args: Vec<&str> = helm_args.iter().map(String::as_str).collect();
    ok("helm", &helm_args, None);

    let name = "orders";
    ok(
        "kubectl",
        &["apply", "-f", "-"],
        Some(&consumer_manifest(
            &ns,
            name,
            &queue_url,
            &in_cluster,
            &env.image,
        )),
    );
    let wait = run(
        "kubectl",
        &[
            "-n",
            &ns,
            "wait",
            "--for=condition=Ready",
            &format!("queueconsumer/{name}"),
            "--timeout=180s",
        ],
        None,
    );
    if !wait.status.success() {
        let status = run(
            "kubectl",
            &["-n", &ns, "get", "queueconsumer", name, "-o", "yaml"],
            None,
        );
        let logs = run(
            "kubectl",
            &[
                "-n",
                &ns,
                "logs",
                "deployment/qc-queue-consumer-operator",
                "--tail=100",
            ],
            None,
        );
        panic!(
            "QueueConsumer {ns}/{name} did not become Ready:\n{}\n{}\ncontroller logs:\n{}",
            String::from_utf8_lossy(&wait.stderr),
            String::from_utf8_lossy(&status.stdout),
            String::from_utf8_lossy(&logs.stdout)
        );
    }

    // The worker Deployment exists, is owned by the QueueConsumer and carries the documented labels.
    let owner = ok(
        "kubectl",
        &[
            "-n",
            &ns,
            "get",
            "deployment",
            name,
            "-o",
            "jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name} {.metadata.labels.app\\.kubernetes\\.io/managed-by}",
        ],
        None,
    );
    assert_eq!(owner.trim(), format!("QueueConsumer/{name} qc-operator"));
}

#[test]
fn image_values_split_tags_and_digests() {
    assert_eq!(
        image_values("registry.example:5000/qc:0.1.0"),
        [
            "image.repository=registry.example:5000/qc",
            "image.tag=0.1.0"
        ]
    );
    assert_eq!(
        image_values("registry.example:5000/qc"),
        ["image.repository=registry.example:5000/qc"]
    );
    assert_eq!(
        image_values("qc@sha256:abc"),
        ["image.repository=qc", "image.digest=sha256:abc"]
    );
}
