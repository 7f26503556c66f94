//! The real Kubernetes control plane `scripts/test` starts (kube-apiserver, kube-controller-manager,
//! kube-scheduler and etcd, built by scripts/k8s-cluster.sh): namespaces as users make them, the chart
//! installed with helm, and `qc-operator run` out of cluster with a token of the chart's ServiceAccount, so
//! every request it makes meets the chart's real RBAC.
//!
//! `QC_TEST_CLUSTER_KUBECONFIG` names the cluster admin's kubeconfig. Without it a test skips and says so
//! loudly, unless `QC_REQUIRE_CLUSTER=1` (set by `scripts/test`): then it fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, PostParams};

pub const CHART: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/charts/queue-consumer-operator"
);

/// The cluster, as its admin.
pub struct Cluster {
    pub admin: kube::Client,
    pub kubeconfig: String,
    pub audit_log: Option<PathBuf>,
    /// The control plane's run directory (`QC_TEST_CLUSTER_RUN_DIR`): what `restart_apiserver` needs.
    pub run_dir: Option<PathBuf>,
}

/// The cluster, or None after a loud skip message (a failure when `QC_REQUIRE_CLUSTER=1`).
pub async fn connect(test: &str) -> Option<Cluster> {
    let kubeconfig = match std::env::var("QC_TEST_CLUSTER_KUBECONFIG") {
        Ok(path) if !path.is_empty() => path,
        _ => {
            assert!(
                std::env::var("QC_REQUIRE_CLUSTER").as_deref() != Ok("1"),
                "{test}: QC_REQUIRE_CLUSTER=1 but QC_TEST_CLUSTER_KUBECONFIG is not set: \
                 source scripts/lib.sh and run start_k8s_cluster"
            );
            eprintln!(
                "\n!!! SKIPPED {test}: no Kubernetes control plane (QC_TEST_CLUSTER_KUBECONFIG unset). \
                 `source scripts/lib.sh; start_k8s_cluster` starts one; scripts/test always does.\n"
            );
            return None;
        }
    };
    let admin = super::k8s::client(&kubeconfig).await;
    Some(Cluster {
        admin,
        kubeconfig,
        audit_log: std::env::var_os("QC_TEST_CLUSTER_AUDIT_LOG").map(PathBuf::from),
        run_dir: std::env::var_os("QC_TEST_CLUSTER_RUN_DIR").map(PathBuf::from),
    })
}

/// A DNS label unique to this process and call, from `test`.
pub fn unique(test: &str) -> String {
    super::k8s::unique_namespace(test)
        .chars()
        .rev()
        .take(50)
        .collect::<String>()
        .chars()
        .rev()
        .collect::<String>()
        .trim_start_matches('-')
        .to_string()
}

/// helm, kubectl: from the cache scripts/lib.sh's ensure_helm fills, else PATH.
pub fn tool(name: &str) -> PathBuf {
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

/// A cluster-wide operator reconciles every QueueConsumer in the cluster: a test running one holds this
/// for writing, so no test of the same binary has QueueConsumers of its own meanwhile (they hold it for
/// reading).
pub static CLUSTER_WIDE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The chart's CRD is installed by the first release of a run; later ones find it there (helm refuses to
/// adopt a CRD another release owns), as a second install in a real cluster would.
static CRD_INSTALL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Cluster {
    /// Runs helm or kubectl as the admin; stdout, or a panic with both outputs.
    pub fn run(&self, tool_name: &str, args: &[&str]) -> String {
        let out = Command::new(tool(tool_name))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env(
                "KUBECACHEDIR",
                std::env::temp_dir().join(format!("qc-cluster-kubectl-{}", std::process::id())),
            )
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{tool_name} runs: {e}"));
        assert!(
            out.status.success(),
            "{tool_name} {args:?} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates a namespace; `restricted`: labelled to enforce the restricted Pod Security Standard, as
    /// docs/security.md recommends for the operator's and the workers' namespaces.
    pub async fn namespace(&self, name: &str, restricted: bool) {
        let mut ns = serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}
        });
        if restricted {
            ns["metadata"]["labels"] = serde_json::json!({
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            });
        }
        let ns: Namespace = serde_json::from_value(ns).expect("a Namespace");
        Api::<Namespace>::all(self.admin.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("the namespace is created");
    }

    /// Deletes a namespace without waiting.
    pub async fn delete_namespace(&self, name: &str) {
        let _ = Api::<Namespace>::all(self.admin.clone())
            .delete(name, &DeleteParams::default())
            .await;
    }

    /// `helm install RELEASE CHART -n NAMESPACE` with `--set`/`--set-json` arguments as given; the CRD from
    /// the chart when no release has installed it yet.
    pub async fn helm_install(&self, release: &str, namespace: &str, values: &[&str]) {
        let _guard = CRD_INSTALL.lock().await;
        let crds: Api<CustomResourceDefinition> = Api::all(self.admin.clone());
        let install_crd = crds
            .get_opt(super::k8s::CRD_NAME)
            .await
            .expect("read the CRD")
            .is_none();
        let crd_value = format!("crds.install={install_crd}");
        let mut args = vec![
            "install",
            release,
            CHART,
            "--namespace",
            namespace,
            "--set",
            &crd_value,
            "--set",
            "logFormat=text",
        ];
        args.extend_from_slice(values);
        self.run("helm", &args);
        if install_crd {
            super::k8s::wait_established(&self.admin).await;
        }
    }

    /// A kubeconfig holding a token of `namespace/service_account` from the TokenRequest API (an hour),
    /// written into `dir`: whoever uses it is that ServiceAccount, with exactly its RBAC.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        service_account: &str,
        dir: &Path,
    ) -> PathBuf {
        self.service_account_token(namespace, service_account, dir, service_account)
            .await
            .0
    }

    /// As `service_account_kubeconfig`, into `dir/NAMESPACE-FILE.kubeconfig`, with the token's credential
    /// id as audit events show it (`user.extra["authentication.kubernetes.io/credential-id"]`, "JTI=…"):
    /// two clients of one ServiceAccount, each with a token of its own, are told apart in the audit log.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        service_account: &str,
        dir: &Path,
        file: &str,
    ) -> (PathBuf, String) {
        let sas: Api<ServiceAccount> = Api::namespaced(self.admin.clone(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let token = sas
            .create_token_request(service_account, &PostParams::default(), &request)
            .await
            .expect("TokenRequest for the chart's ServiceAccount")
            .status
            .and_then(|s| s.token)
            .expect("a token in the TokenRequest's status");
        let admin = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("a kubeconfig");
        let cluster = admin.clusters[0].cluster.clone().expect("a cluster entry");
        let server = cluster.server.expect("a server");
        let ca = cluster.certificate_authority.expect("a CA file");
        let path = dir.join(format!("{namespace}-{file}.kubeconfig"));
        let credential = {
            use base64::Engine as _;
            let claims = token.split('.').nth(1).expect("a JWT");
            let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(claims.trim_end_matches('='))
                .expect("base64url claims");
            let claims: serde_json::Value = serde_json::from_slice(&claims).expect("JSON claims");
            format!("JTI={}", claims["jti"].as_str().expect("a jti claim"))
        };
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{ca}\"}}}}]\n\
                 users: [{{name: sa, user: {{token: \"{token}\"}}}}]\n\
                 contexts: [{{name: c, context: {{cluster: c, user: sa, namespace: {namespace}}}}}]\ncurrent-context: c\n"
            ),
        )
        .expect("write the ServiceAccount's kubeconfig");
        (path, credential)
    }

    /// The container arguments of the chart's Deployment `namespace/name` as installed.
    pub async fn chart_args(&self, namespace: &str, name: &str) -> Vec<String> {
        let d = Api::<Deployment>::namespaced(self.admin.clone(), namespace)
            .get(name)
            .await
            .expect("the chart's Deployment");
        d.spec
            .template
            .spec
            .and_then(|s| s.containers.into_iter().next())
            .and_then(|c| c.args)
            .expect("the chart's container has args")
    }

    /// Audit events (one JSON object each) of `user` since `from` lines, waiting until `done` holds for
    /// them or 10 s pass (the API server writes its audit log in batches).
    pub async fn audit_events(
        &self,
        user: &str,
        from: usize,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let log = self
            .audit_log
            .as_ref()
            .expect("QC_TEST_CLUSTER_AUDIT_LOG names the API server's audit log");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = std::fs::read_to_string(log).expect("read the audit log");
            let events: Vec<serde_json::Value> = text
                .lines()
                .skip(from)
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|e| e["user"]["username"] == user)
                .collect();
            if done(&events) || Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The requests of `user` since `from` that RBAC refused (the authorizer's decision `forbid`; a 403
    /// for a namespace being deleted is admission's, not RBAC's), as "verb URI".
    pub async fn rbac_refusals(&self, user: &str, from: usize) -> Vec<String> {
        self.audit_events(user, from, |_| true)
            .await
            .iter()
            .filter(|e| e["annotations"]["authorization.k8s.io/decision"] == "forbid")
            .map(|e| format!("{} {}", e["verb"], e["requestURI"]))
            .collect()
    }

    /// Stops kube-apiserver (`signal`: "TERM" or "KILL"), keeps it down `down_secs`, starts it again as it
    /// was and waits for /readyz (scripts/k8s-cluster.sh `restart-apiserver`). Every client of the cluster
    /// sees the outage: run it only where no other test needs the API server meanwhile.
    pub fn restart_apiserver(&self, down_secs: u64, signal: &str) {
        let run = self
            .run_dir
            .as_ref()
            .expect("QC_TEST_CLUSTER_RUN_DIR names the control plane's run directory");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/k8s-cluster.sh");
        let out = Command::new("bash")
            .arg(script)
            .arg("restart-apiserver")
            .arg(run)
            .arg(down_secs.to_string())
            .arg(signal)
            .stdin(Stdio::null())
            .output()
            .expect("bash runs");
        assert!(
            out.status.success(),
            "restarting kube-apiserver failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Lines in the audit log now: pass to `audit_events` to see only what comes after.
    pub fn audit_mark(&self) -> usize {
        self.audit_log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .map_or(0, |t| t.lines().count())
    }
}

/// A queue with a DLQ on moto that passes the rules for `e2e_consumer` (VT 30s, maxReceiveCount 5,
/// DLQ retention 14 days); its URL.
pub async fn queue_with_dlq(name: &str) -> String {
    use aws_sdk_sqs::types::QueueAttributeName as A;
    let sqs = super::sqs_client().await;
    let dlq = super::create_queue(
        &sqs,
        &format!("{name}-dlq"),
        &[(A::MessageRetentionPeriod, "1209600".into())],
    )
    .await;
    let arn = super::queue_arn(&sqs, &dlq).await;
    super::create_queue(
        &sqs,
        name,
        &[
            (A::VisibilityTimeout, "30".into()),
            (
                A::RedrivePolicy,
                format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"5"}}"#),
            ),
        ],
    )
    .await
}

/// A QueueConsumer `name` for `url` with a DLQ alarm, polled every second, whose pods pass the restricted profile: an exec handler in a container that
/// states what restricted asks of it.
pub fn restricted_consumer(ns: &str, name: &str, url: &str) -> serde_json::Value {
    super::fixture::consumer(name)
        .namespace(ns)
        .on_moto(url)
        .timeout("10s")
        .wait_time("1s")
        .exec("/app/handle")
        .set(
            "/spec/template/spec/containers",
            serde_json::json!([{
                "name": "handler",
                "image": "example.org/shop/handler:1",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "runAsNonRoot": true,
                    "capabilities": {"drop": ["ALL"]},
                    "seccompProfile": {"type": "RuntimeDefault"}
                }
            }]),
        )
        .scaling(serde_json::json!({"minReplicas": 0, "maxReplicas": 2, "pollInterval": "1s"}))
        .alarm(true)
        .json()
}

/// One release of the chart, with its operator run out of cluster.
pub struct Release {
    pub name: String,
    pub namespace: String,
    /// The chart's full name: Deployment, ServiceAccount, Roles, Lease.
    pub fullname: String,
    pub kubeconfig: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Release {
    /// Installs the chart as `release` into the (existing) namespace with `values`, and makes a kubeconfig
    /// with a token of its ServiceAccount.
    pub async fn install(
        cluster: &Cluster,
        release: &str,
        namespace: &str,
        values: &[&str],
    ) -> Self {
        let endpoint = super::sqs_endpoint();
        let allowed = format!(r#"aws.allowedEndpoints=["{endpoint}"]"#);
        let mut all = vec!["--set-json", &allowed];
        all.extend_from_slice(values);
        cluster.helm_install(release, namespace, &all).await;
        let fullname = format!("{release}-queue-consumer-operator");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let kubeconfig = cluster
            .service_account_kubeconfig(namespace, &fullname, dir.path())
            .await;
        Release {
            name: release.to_string(),
            namespace: namespace.to_string(),
            fullname,
            kubeconfig,
            dir,
        }
    }

    /// The ServiceAccount's user name in audit events.
    pub fn user(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.fullname)
    }

    /// Starts `qc-operator run` with the chart's own arguments (the metrics address moved to a free loopback
    /// port), as the pod `identity` of the chart's namespace, with the ServiceAccount's token.
    pub async fn operator(&self, cluster: &Cluster, identity: &str, extra: &[&str]) -> Operator {
        // A token of its own, so its requests are told apart from another replica's in the audit log.
        let (kubeconfig, credential) = cluster
            .service_account_token(&self.namespace, &self.fullname, self.dir.path(), identity)
            .await;
        let mut args = cluster.chart_args(&self.namespace, &self.fullname).await;
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
            l.local_addr().expect("an address")
        };
        for a in &mut args {
            if a.starts_with("--metrics-addr=") {
                *a = format!("--metrics-addr={addr}");
            }
        }
        args.extend(extra.iter().map(|s| (*s).to_string()));
        let log = self.dir.path().join(format!("{identity}.log"));
        let child = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
            .args(&args)
            .env("KUBECONFIG", &kubeconfig)
            .env("POD_NAMESPACE", &self.namespace)
            .env("POD_NAME", identity)
            .env("RUST_LOG", "info,qc=debug")
            .stdout(std::fs::File::create(&log).expect("the operator's log"))
            .stderr(std::fs::File::create(log.with_extension("err")).expect("the operator's log"))
            .spawn()
            .expect("qc-operator runs");
        Operator {
            child: Some(child),
            identity: identity.to_string(),
            credential,
            log,
            metrics: format!("http://{addr}/metrics"),
        }
    }
}

/// A running `qc-operator run`; killed when dropped.
pub struct Operator {
    pub child: Option<Child>,
    pub identity: String,
    /// Its token's credential id in audit events (`Operator::made`).
    pub credential: String,
    pub log: PathBuf,
    pub metrics: String,
}

impl Operator {
    /// What it logged so far (stdout and stderr).
    pub fn logs(&self) -> String {
        let out = std::fs::read_to_string(&self.log).unwrap_or_default();
        let err = std::fs::read_to_string(self.log.with_extension("err")).unwrap_or_default();
        format!("{out}{err}")
    }

    /// SIGTERM, and wait for the exit (it releases the Lease on the way).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether this operator made the audit event `e` (by its token's credential id).
    pub fn made(&self, e: &serde_json::Value) -> bool {
        e["user"]["extra"]["authentication.kubernetes.io/credential-id"]
            .as_array()
            .is_some_and(|ids| ids.iter().any(|id| id == self.credential.as_str()))
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGKILL: no release, no goodbye.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `check` every 100 ms until it returns Some, or panics after `secs` with `what` and `context()`.
pub async fn eventually<T, F, Fut>(
    secs: u64,
    what: &str,
    context: impl Fn() -> String,
    check: F,
) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {secs} s\n{}",
            context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
