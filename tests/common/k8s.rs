//! The real Kubernetes API server for custom resources that `scripts/test` starts (the upstream
//! apiextensions-apiserver with etcd, from ../shared/k8s): how a test reaches it, with the committed
//! CRD installed, in a namespace of its own.
//!
//! `QC_TEST_KUBECONFIG` names its kubeconfig. Without it a test skips and says so loudly, unless
//! `QC_REQUIRE_CRDSERVER=1` (set by `scripts/test` when it started the server): then it fails.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};

/// The committed CRD, as a user installs it.
pub const CRD_YAML: &str = include_str!("../../crds/queueconsumers.sqs.consumers.dev.yaml");
pub const CRD_NAME: &str = "queueconsumers.sqs.consumers.dev";

/// A connection to the real server and a fresh namespace for one test.
pub struct RealKube {
    pub client: kube::Client,
    pub namespace: String,
    pub kubeconfig: String,
}

impl RealKube {
    /// QueueConsumers in this test's namespace as untyped objects: what `kubectl apply` sends, unknown
    /// fields and all, so the server's own schema, defaults and CEL rules judge them.
    pub fn queue_consumers(&self) -> Api<DynamicObject> {
        let gvk = GroupVersionKind::gvk("sqs.consumers.dev", "v1alpha1", "QueueConsumer");
        Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &ApiResource::from_gvk(&gvk),
        )
    }
}

/// As `kubectl apply --server-side --dry-run=server` sends `obj`: strict field validation, nothing
/// stored.
pub async fn kubectl_dry_apply(
    api: &Api<DynamicObject>,
    name: &str,
    obj: &serde_json::Value,
) -> Result<DynamicObject, kube::Error> {
    let mut pp = PatchParams::apply("kubectl").validation_strict();
    pp.dry_run = true;
    api.patch(name, &pp, &Patch::Apply(obj)).await
}

/// The kubeconfig of the real server, or None after a loud skip message (a failure when the server is
/// required).
pub fn kubeconfig(test: &str) -> Option<String> {
    match std::env::var("QC_TEST_KUBECONFIG") {
        Ok(path) if !path.is_empty() => Some(path),
        _ => {
            assert!(
                std::env::var("QC_REQUIRE_CRDSERVER").as_deref() != Ok("1"),
                "{test}: QC_REQUIRE_CRDSERVER=1 but QC_TEST_KUBECONFIG is not set: \
                 source scripts/lib.sh and run start_crdserver"
            );
            eprintln!(
                "\n!!! SKIPPED {test}: no real Kubernetes API server (QC_TEST_KUBECONFIG unset). \
                 `source scripts/lib.sh; start_crdserver` starts one; scripts/test always does.\n"
            );
            None
        }
    }
}

/// A client for the real server as cluster admin.
pub async fn client(kubeconfig: &str) -> kube::Client {
    // As `qc-operator run` does: two rustls providers are compiled in, and rustls picks none itself.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let kc = Kubeconfig::read_from(kubeconfig).expect("QC_TEST_KUBECONFIG is a kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig loads");
    kube::Client::try_from(config).expect("client builds")
}

/// Connect, install the committed CRD (server-side apply: a no-op when it is there already), wait
/// until it is Established, and pick a namespace no other test uses.
pub async fn connect(test: &str) -> Option<RealKube> {
    let kubeconfig = kubeconfig(test)?;
    let client = client(&kubeconfig).await;
    install_crd(&client, CRD_YAML, "qc-tests").await;
    Some(RealKube {
        client,
        namespace: unique_namespace(test),
        kubeconfig,
    })
}

/// Server-side apply of a CRD document, then wait for Established.
pub async fn install_crd(client: &kube::Client, yaml: &str, manager: &str) {
    let crd: CustomResourceDefinition = serde_saphyr::from_str(yaml).expect("the CRD parses");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        CRD_NAME,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("the CRD applies");
    wait_established(client).await;
}

pub async fn wait_established(client: &kube::Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let crd = crds.get(CRD_NAME).await.expect("the CRD reads back");
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .into_iter()
            .flatten()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the CRD never became Established"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A DNS-label namespace unique to this process and call; the CRD server has no Namespace API and
/// accepts any namespace, so nothing needs creating or cleaning up.
pub fn unique_namespace(test: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let stem: String = test
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    format!(
        "{}-{}-{}",
        stem.trim_matches('-'),
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// Real `kubectl` (scripts/lib.sh's ensure_helm puts it in the cache), or None after a loud skip
/// message (a failure when the real server is required).
pub fn kubectl(test: &str) -> Option<std::path::PathBuf> {
    let cache = std::env::var_os("HOME")
        .map(|h| std::path::PathBuf::from(h).join(".cache/queue-consumer-operator/bin"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = cache
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("QC_REQUIRE_CRDSERVER").as_deref() != Ok("1"),
            "{test}: kubectl is required but not found: source scripts/lib.sh and run ensure_helm"
        );
        eprintln!("\n!!! SKIPPED {test}: kubectl not found (scripts/test installs it)\n");
    }
    found
}

/// Run kubectl against the real server with `stdin`; (success, stdout, stderr).
pub fn run_kubectl(
    kubectl: &std::path::Path,
    kubeconfig: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> (bool, String, String) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(kubectl)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        // A cache per call: parallel kubectl runs must not share a discovery cache being written.
        .env(
            "KUBECACHEDIR",
            std::env::temp_dir().join(format!("qc-kubectl-cache-{}", std::process::id())),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    let mut input = child.stdin.take().expect("stdin");
    input
        .write_all(stdin.unwrap_or("").as_bytes())
        .expect("kubectl reads stdin");
    drop(input);
    let out = child.wait_with_output().expect("kubectl finishes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
