//! The packaging stays in step with the code: every copy of the CRD equals what the types generate, the
//! chart and config/ render the RBAC, image wiring and pod security that docs/security.md promises.
//!
//! Tests that render need real `helm` and `kubectl` (`scripts/test` installs them and sets QC_REQUIRE_HELM=1,
//! so there they cannot skip); a bare `cargo test` without them skips those tests with a note.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const CHART: &str = "charts/queue-consumer-operator";
const NS: &str = "qc-system";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).unwrap_or_else(|e| panic!("read {path}: {e}"))
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn generated_crd() -> Value {
    serde_saphyr::from_str(&qc::api::crd_yaml().unwrap()).unwrap()
}

/// Integral floats as integers: a re-serialising tool (kustomize) writes the CRD's `maximum: 10.0` as `10`.
fn normalized(v: &Value) -> Value {
    match v {
        Value::Number(n) => match n.as_f64() {
            Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9e15 => json!(f as i64),
            _ => v.clone(),
        },
        Value::Array(a) => Value::Array(a.iter().map(normalized).collect()),
        Value::Object(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), normalized(v))).collect())
        }
        _ => v.clone(),
    }
}

const SYNC: &str = "run `bash scripts/sync-crds` to regenerate every CRD copy";

#[test]
fn config_crd_copy_matches_types() {
    let copy = read("config/crd/queueconsumers.sqs.consumers.dev.yaml");
    assert!(
        copy == qc::api::crd_yaml().unwrap(),
        "config/crd/queueconsumers.sqs.consumers.dev.yaml is stale: {SYNC}"
    );
}

/// The chart's CRD is the generated one plus a Helm wrapper: the toggle, labels and the keep annotation.
#[test]
fn chart_crd_body_matches_types() {
    let template = read(&format!("{CHART}/templates/crd.yaml"));
    #[allow(clippy::format_collect)]
    let body: String = template
        .lines()
        .filter(|l| !l.trim_start().starts_with("{{"))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut chart: Value = serde_saphyr::from_str(&body).unwrap();
    let meta = chart["metadata"].as_object_mut().unwrap();
    meta.remove("labels");
    meta.remove("annotations");
    assert!(
        chart == generated_crd(),
        "{CHART}/templates/crd.yaml is stale: {SYNC}"
    );
}

/// Real helm on PATH (or in the cache scripts/lib.sh installs it to); None lets a bare `cargo test` skip.
fn tool(name: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/queue-consumer-operator/bin"));
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = cache
        .into_iter()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(name))
        .find(|p| p.is_file());
    if found.is_none() {
        assert!(
            std::env::var("QC_REQUIRE_HELM").as_deref() != Ok("1"),
            "{name} is required (QC_REQUIRE_HELM=1) but not found: source scripts/lib.sh and run ensure_helm"
        );
        eprintln!("skipped: {name} not found (scripts/test installs it)");
    }
    found
}

/// `helm template` of the chart in namespace qc-system; Err carries helm's message.
fn render(args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    render_chart(&repo(CHART), args)
}

/// `helm template` of the chart at `chart` (release qc, namespace qc-system).
fn render_chart(chart: &Path, args: &[&str]) -> Option<Result<Vec<Value>, String>> {
    let helm = tool("helm")?;
    let out = Command::new(helm)
        .args(["template", "qc"])
        .arg(chart)
        .args(["--namespace", NS])
        .args(args)
        .current_dir(repo(""))
        .output()
        .unwrap();
    Some(if out.status.success() {
        Ok(yaml_docs(&String::from_utf8(out.stdout).unwrap()))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn kinds(docs: &[Value], kind: &str) -> Vec<Value> {
    docs.iter().filter(|d| d["kind"] == kind).cloned().collect()
}

/// RBAC rules flattened to (group, resource, verb) triples, names ignored.
fn grants(rules: &Value) -> BTreeSet<(String, String, String)> {
    let mut out = BTreeSet::new();
    for rule in rules.as_array().unwrap() {
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    out.insert((
                        g.as_str().unwrap().to_string(),
                        r.as_str().unwrap().to_string(),
                        v.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out
}

/// What docs/security.md says the controller may do in a namespace it watches, and nothing more.
fn expected_controller_grants() -> BTreeSet<(String, String, String)> {
    let spec: &[(&str, &str, &[&str])] = &[
        (
            "sqs.consumers.dev",
            "queueconsumers",
            &["get", "list", "watch", "patch"],
        ),
        ("sqs.consumers.dev", "queueconsumers/status", &["patch"]),
        (
            "sqs.consumers.dev",
            "queueconsumers/finalizers",
            &["update"],
        ),
        (
            "apps",
            "deployments",
            // delete: the bundled worker's own Deployment, when its QueueConsumer switches to
            // scale-only mode
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        // scale-only mode: the user's workloads, through /scale only; read for the opt-in annotation
        ("apps", "statefulsets", &["get"]),
        ("apps", "deployments/scale", &["get", "patch"]),
        ("apps", "statefulsets/scale", &["get", "patch"]),
        // the worker pods: start-up (scaleDownStabilization: auto), /metrics, crash loops; deletion cost
        ("", "pods", &["list", "patch"]),
        ("", "events", &["create", "patch"]),
        ("events.k8s.io", "events", &["create", "patch"]),
    ];
    spec.iter()
        .flat_map(|(g, r, verbs)| {
            verbs
                .iter()
                .map(move |v| (g.to_string(), r.to_string(), v.to_string()))
        })
        .collect()
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn args(deployment: &Value) -> Vec<String> {
    container(deployment)["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

fn assert_lease_role(docs: &[Value]) {
    let role = find(docs, "Role", "qc-queue-consumer-operator-leader-election");
    assert_eq!(role["metadata"]["namespace"], NS);
    let rules = role["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0]["resources"], json!(["leases"]));
    assert_eq!(rules[0]["verbs"], json!(["create"]));
    assert_eq!(
        rules[1]["resourceNames"],
        json!(["qc-queue-consumer-operator"])
    );
    assert_eq!(
        rules[1]["verbs"],
        json!(["get", "list", "watch", "update", "patch"])
    );
    let binding = find(
        docs,
        "RoleBinding",
        "qc-queue-consumer-operator-leader-election",
    );
    assert_eq!(binding["metadata"]["namespace"], NS);
    assert_eq!(binding["subjects"][0]["namespace"], NS);
}

#[test]
fn chart_default_rbac_is_the_documented_least_privilege() {
    let Some(docs) = render(&[]) else { return };
    let docs = docs.unwrap();
    let role = find(&docs, "ClusterRole", "qc-queue-consumer-operator");
    assert_eq!(grants(&role["rules"]), expected_controller_grants());
    let binding = find(&docs, "ClusterRoleBinding", "qc-queue-consumer-operator");
    assert_eq!(binding["roleRef"]["name"], "qc-queue-consumer-operator");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": "qc-queue-consumer-operator", "namespace": NS}])
    );
    // The only cluster-wide binding is the controller's; the aggregated roles reach users through theirs.
    assert_eq!(kinds(&docs, "ClusterRoleBinding").len(), 1);
    assert_lease_role(&docs);
    // config/rbac is a second copy of the same rules for `kubectl apply -k`.
    let kustomize_role: Value = serde_saphyr::from_str(&read("config/rbac/role.yaml")).unwrap();
    assert_eq!(
        grants(&kustomize_role["rules"]),
        expected_controller_grants()
    );
}

#[test]
fn chart_scale_targets_grant_their_scale_subresource_and_a_read() {
    let Some(docs) = render(&[
        "--set-json",
        r#"rbac.scaleTargets=[{"apiGroup":"argoproj.io","resources":["rollouts"]}]"#,
    ]) else {
        return;
    };
    let docs = docs.unwrap();
    let role = find(&docs, "ClusterRole", "qc-queue-consumer-operator");
    let mut expected = expected_controller_grants();
    for verb in ["get", "patch"] {
        expected.insert((
            "argoproj.io".to_string(),
            "rollouts/scale".to_string(),
            verb.to_string(),
        ));
    }
    // get on the object, for its opt-in annotation; no write of it
    expected.insert((
        "argoproj.io".to_string(),
        "rollouts".to_string(),
        "get".to_string(),
    ));
    assert_eq!(grants(&role["rules"]), expected);
    // A resource that is no DNS label is refused by the chart's schema.
    let bad = render(&[
        "--set-json",
        r#"rbac.scaleTargets=[{"apiGroup":"argoproj.io","resources":["Rollouts/scale"]}]"#,
    ])
    .unwrap();
    assert!(bad.is_err(), "{bad:?}");
}

#[test]
fn chart_namespaced_mode_grants_nothing_cluster_wide() {
    let Some(docs) = render(&["--set-json", r#"watchNamespaces=["team-a","team-b"]"#]) else {
        return;
    };
    let docs = docs.unwrap();
    assert!(kinds(&docs, "ClusterRoleBinding").is_empty());
    // The controller's rules in one ClusterRole, bound only by RoleBindings in the watched namespaces (a
    // namespace's deletion must not delete them under the controller: docs/install.md); besides it only
    // the view/edit aggregation roles, which nothing binds to the controller.
    // Named after the release namespace too: namespaced releases of one name in two namespaces coexist.
    let role = find(&docs, "ClusterRole", "qc-system-qc-queue-consumer-operator");
    let mut expected = expected_controller_grants();
    for verb in ["get", "patch"] {
        expected.insert((
            "rbac.authorization.k8s.io".to_string(),
            "rolebindings".to_string(),
            verb.to_string(),
        ));
    }
    assert_eq!(grants(&role["rules"]), expected);
    let own_binding = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"] == json!(["rolebindings"]))
        .unwrap();
    assert_eq!(
        own_binding["resourceNames"],
        json!(["qc-queue-consumer-operator"])
    );
    let cluster_roles = kinds(&docs, "ClusterRole");
    assert_eq!(cluster_roles.len(), 3);
    for role in cluster_roles
        .iter()
        .filter(|r| r["metadata"]["name"] != "qc-system-qc-queue-consumer-operator")
    {
        let labels = role["metadata"]["labels"].as_object().unwrap();
        assert!(
            labels
                .keys()
                .any(|k| k.starts_with("rbac.authorization.k8s.io/aggregate-to-")),
            "{role}"
        );
    }
    for ns in ["team-a", "team-b"] {
        assert!(
            !docs
                .iter()
                .any(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == ns),
            "a Role in {ns}"
        );
        let binding = docs
            .iter()
            .find(|d| d["kind"] == "RoleBinding" && d["metadata"]["namespace"] == ns)
            .unwrap_or_else(|| panic!("no RoleBinding in {ns}"));
        assert_eq!(binding["roleRef"]["kind"], "ClusterRole");
        assert_eq!(
            binding["roleRef"]["name"],
            "qc-system-qc-queue-consumer-operator"
        );
        assert_eq!(binding["name"], serde_json::Value::Null);
        assert_eq!(binding["metadata"]["name"], "qc-queue-consumer-operator");
        assert_eq!(binding["subjects"][0]["namespace"], NS);
    }
    assert_lease_role(&docs);
    let deployment = find(&docs, "Deployment", "qc-queue-consumer-operator");
    let a = args(deployment);
    assert!(a.contains(&"--namespace=team-a".to_string()), "{a:?}");
    assert!(a.contains(&"--namespace=team-b".to_string()), "{a:?}");
    assert!(
        a.contains(&"--access-binding=qc-queue-consumer-operator".to_string()),
        "{a:?}"
    );

    // With the CRD and aggregation off, the release's only cluster-scoped object is that ClusterRole.
    let docs = render(&[
        "--set-json",
        r#"watchNamespaces=["team-a"]"#,
        "--set",
        "crds.install=false",
        "--set",
        "rbac.aggregateToDefaultRoles=false",
    ])
    .unwrap()
    .unwrap();
    let cluster_scoped: Vec<_> = docs
        .iter()
        .filter(|d| d["metadata"]["namespace"].is_null())
        .map(|d| format!("{} {}", d["kind"], d["metadata"]["name"]))
        .collect();
    assert_eq!(
        cluster_scoped,
        [r#""ClusterRole" "qc-system-qc-queue-consumer-operator""#]
    );
}

#[test]
fn chart_controller_pod_meets_restricted_pod_security() {
    let Some(docs) = render(&[]) else { return };
    let docs = docs.unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let sc = &container(d)["securityContext"];
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert!(sc["capabilities"]["add"].is_null());
    assert!(pod["hostNetwork"].is_null() && pod["hostPID"].is_null());
    assert_eq!(
        container(d)["command"],
        json!(["/usr/local/bin/qc-operator"])
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(container(d)[probe]["httpGet"]["port"], "metrics");
    }
}

#[test]
fn chart_wires_one_image_into_controller_and_workers() {
    let Some(docs) = render(&[]) else { return };
    let docs = docs.unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert_eq!(container(d)["image"], "queue-consumer-operator:0.1.0");
    let a = args(d);
    assert_eq!(a[0], "run");
    assert!(a.contains(&"--worker-image=queue-consumer-operator:0.1.0".to_string()));
    assert!(a.contains(&"--leader-election".to_string()));
    assert!(a.contains(&format!("--lease-namespace={NS}")));
    assert!(a.contains(&"--lease-name=qc-queue-consumer-operator".to_string()));
    assert!(!a.iter().any(|x| x.starts_with("--namespace")), "{a:?}");

    let digest = format!("sha256:{}", "ab".repeat(32));
    let docs = render(&[
        "--set",
        "image.repository=registry.example/qc",
        "--set",
        &format!("image.digest={digest}"),
        "--set",
        "replicaCount=2",
    ])
    .unwrap()
    .unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    let reference = format!("registry.example/qc@{digest}");
    assert_eq!(container(d)["image"], reference.as_str());
    assert!(args(d).contains(&format!("--worker-image={reference}")));
    assert_eq!(d["spec"]["replicas"], 2);

    let docs = render(&["--set", "worker.image=registry.example/worker:1"])
        .unwrap()
        .unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert!(args(d).contains(&"--worker-image=registry.example/worker:1".to_string()));
    assert_eq!(container(d)["image"], "queue-consumer-operator:0.1.0");
}

/// As a subchart of an umbrella chart: Helm hands every subchart the parent's `global` values, which the
/// schema must accept (keys this chart does not know included); global.imageRegistry and
/// global.imagePullSecrets reach the pod, and the parent's values for the chart reach it too.
#[test]
fn chart_renders_as_a_subchart_of_an_umbrella_chart() {
    let dir = tempfile::tempdir().unwrap();
    let umbrella = dir.path().join("platform");
    copy_dir(
        &repo(CHART),
        &umbrella.join("charts/queue-consumer-operator"),
    );
    std::fs::write(
        umbrella.join("Chart.yaml"),
        "apiVersion: v2\nname: platform\nversion: 1.0.0\n\
         dependencies: [{name: queue-consumer-operator, version: 0.1.0}]\n",
    )
    .unwrap();
    std::fs::write(
        umbrella.join("values.yaml"),
        "global:\n  imageRegistry: registry.example:5000\n  imagePullSecrets: [platform-pull]\n  \
         storageClass: fast\nqueue-consumer-operator:\n  image: {repository: infra/qc, tag: \"1.2.3\"}\n  \
         imagePullSecrets: [{name: qc-pull}]\n",
    )
    .unwrap();
    let Some(docs) = render_chart(&umbrella, &[]) else {
        return;
    };
    let docs = docs.unwrap_or_else(|e| panic!("helm template of the umbrella chart: {e}"));
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    let reference = "registry.example:5000/infra/qc:1.2.3";
    assert_eq!(container(d)["image"], reference);
    assert!(args(d).contains(&format!("--worker-image={reference}")));
    assert_eq!(
        d["spec"]["template"]["spec"]["imagePullSecrets"],
        json!([{"name": "platform-pull"}, {"name": "qc-pull"}])
    );
    assert!(kinds(&docs, "CustomResourceDefinition").len() == 1);
}

/// The values users of popular charts expect, each changing exactly its part of the output.
#[test]
fn chart_values_for_names_image_security_and_logs() {
    let Some(defaults) = render(&[]) else { return };
    let defaults = defaults.unwrap();
    let d = find(&defaults, "Deployment", "qc-queue-consumer-operator");
    // No RUST_LOG unless asked: the binaries default to info.
    let env = container(d)["env"].as_array().unwrap();
    assert!(!env.iter().any(|e| e["name"] == "RUST_LOG"), "{env:?}");
    assert!(d["spec"]["template"]["spec"]["imagePullSecrets"].is_null());

    let docs = render(&[
        "--set",
        "nameOverride=qc",
        "--set",
        r"logLevel=info\,qc::controller=debug",
        "--set",
        "logFormat=text",
        "--set",
        "image.registry=registry.example",
        "--set",
        "image.tag=2.0.0",
    ])
    .unwrap()
    .unwrap();
    // nameOverride names the labels; the release name "qc" contains it, so it is the full name too.
    let d = find(&docs, "Deployment", "qc");
    assert_eq!(
        d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "qc"
    );
    assert_eq!(
        container(d)["image"],
        "registry.example/queue-consumer-operator:2.0.0"
    );
    let env = container(d)["env"].as_array().unwrap();
    let rust_log = env.iter().find(|e| e["name"] == "RUST_LOG").unwrap();
    assert_eq!(rust_log["value"], "info,qc::controller=debug");
    assert!(args(d).contains(&"--log-format=text".to_string()));
    find(&docs, "ClusterRole", "qc");
    find(&docs, "ServiceAccount", "qc");

    let docs = render(&["--set", "fullnameOverride=queues"])
        .unwrap()
        .unwrap();
    let d = find(&docs, "Deployment", "queues");
    assert!(args(d).contains(&"--lease-name=queues".to_string()));

    // OpenShift: the SCC assigns the uid and gid, so the chart must be able to leave them out.
    let docs = render(&[
        "--set",
        "podSecurityContext.runAsUser=null",
        "--set",
        "podSecurityContext.runAsGroup=null",
        "--set",
        "securityContext.readOnlyRootFilesystem=true",
    ])
    .unwrap()
    .unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    let pod_sc = d["spec"]["template"]["spec"]["securityContext"]
        .as_object()
        .unwrap();
    assert!(!pod_sc.contains_key("runAsUser") && !pod_sc.contains_key("runAsGroup"));
    assert_eq!(pod_sc["runAsNonRoot"], true);
    assert_eq!(pod_sc["seccompProfile"]["type"], "RuntimeDefault");
    assert_eq!(
        container(d)["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
}

/// The workers' PodMonitor selects what render gives every worker pod: its labels and its metrics port.
#[test]
fn chart_pod_monitor_selects_the_worker_pods_render_makes() {
    let Some(docs) = render(&[
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set",
        "metrics.podMonitor.labels.release=prometheus",
    ]) else {
        return;
    };
    let docs = docs.unwrap();
    let pm = find(&docs, "PodMonitor", "qc-queue-consumer-operator-workers");
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(pm["spec"]["namespaceSelector"], json!({"any": true}));
    let qc = qc::api::QueueConsumer::new(
        "orders",
        serde_json::from_value(json!({
            "queue": {"url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"},
            "processing": {"p99": "1s"},
            "handler": {"http": {}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app:1"}]}}
        }))
        .unwrap(),
    );
    let worker = serde_json::to_value(
        qc::render::deployment(&qc, &qc::render::RenderOptions::default()).unwrap(),
    )
    .unwrap();
    let pod = &worker["spec"]["template"];
    let selector = pm["spec"]["selector"]["matchLabels"].as_object().unwrap();
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(&pod["metadata"]["labels"][k], v, "{k}");
    }
    let ports: Vec<&Value> = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .map(|p| &p["name"])
        .collect();
    let endpoints = pm["spec"]["podMetricsEndpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0]["port"], qc::render::METRICS_PORT_NAME);
    assert!(
        ports.contains(&&json!(qc::render::METRICS_PORT_NAME)),
        "{ports:?}"
    );
    assert_eq!(endpoints[0]["path"], "/metrics");
    assert_eq!(
        endpoints[0]["relabelings"][0]["targetLabel"],
        "queueconsumer"
    );
    // Only fields of the monitoring.coreos.com/v1 PodMetricsEndpoint type.
    let known: BTreeSet<&str> = [
        "port",
        "path",
        "interval",
        "scrapeTimeout",
        "relabelings",
        "metricRelabelings",
    ]
    .into();
    let ep = endpoints[0].as_object().unwrap();
    assert!(ep.keys().all(|k| known.contains(k.as_str())), "{ep:?}");

    let docs = render(&[
        "--set",
        "metrics.podMonitor.enabled=true",
        "--set-json",
        r#"watchNamespaces=["team-a","team-b"]"#,
    ])
    .unwrap()
    .unwrap();
    let pm = find(&docs, "PodMonitor", "qc-queue-consumer-operator-workers");
    assert_eq!(
        pm["spec"]["namespaceSelector"],
        json!({"matchNames": ["team-a", "team-b"]})
    );
    let off = render(&[]).unwrap().unwrap();
    assert!(kinds(&off, "PodMonitor").is_empty());
}

#[test]
fn chart_crd_is_toggled_and_kept_on_uninstall() {
    let Some(docs) = render(&[]) else { return };
    let crd = find(
        &docs.unwrap(),
        "CustomResourceDefinition",
        "queueconsumers.sqs.consumers.dev",
    )
    .clone();
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert!(
        crd["spec"] == generated_crd()["spec"],
        "the chart renders a CRD that differs from the types: {SYNC}"
    );
    let off = render(&["--set", "crds.install=false"]).unwrap().unwrap();
    assert!(kinds(&off, "CustomResourceDefinition").is_empty());
    let unkept = render(&["--set", "crds.keep=false"]).unwrap().unwrap();
    let crd = &kinds(&unkept, "CustomResourceDefinition")[0];
    assert!(crd["metadata"]["annotations"].is_null(), "{crd}");
}

#[test]
fn chart_rejects_bad_values_naming_the_field() {
    let cases: &[(&[&str], &str)] = &[
        (&["--set", "replicaCount=-1"], "replicaCount"),
        (&["--set", "replicas=2"], "replicas"),
        (&["--set", "logFormat=xml"], "logFormat"),
        (&["--set", "image.digest=latest"], "digest"),
        (
            &["--set-json", r#"watchNamespaces=["Team_A"]"#],
            "watchNamespaces",
        ),
        (&["--set", "metrics.port=80"], "port"),
        (&["--set", "logLevel=debug info"], "logLevel"),
        (
            &["--set", "image.registry=https://registry.example"],
            "registry",
        ),
        (&["--set", "nameOverride=Queue_Consumer"], "nameOverride"),
        (
            &["--set-json", r#"global={"imagePullSecrets":[""]}"#],
            "imagePullSecrets",
        ),
        (
            &["--set", "podSecurityContext.runAsUser=nobody"],
            "runAsUser",
        ),
        (
            &[
                "--set",
                "replicaCount=2",
                "--set",
                "leaderElection.enabled=false",
            ],
            "leaderElection.enabled",
        ),
        (
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
            ],
            "metrics.service.enabled",
        ),
    ];
    for (args, field) in cases {
        let Some(result) = render(args) else { return };
        match result {
            Ok(_) => panic!("helm template {args:?} rendered; it must fail"),
            Err(msg) => assert!(msg.contains(field), "{args:?}: {msg}"),
        }
    }
}

#[test]
fn chart_service_monitor_scrapes_the_metrics_service() {
    let Some(docs) = render(&[
        "--set",
        "metrics.serviceMonitor.enabled=true",
        "--set",
        "metrics.serviceMonitor.labels.release=prometheus",
    ]) else {
        return;
    };
    let docs = docs.unwrap();
    let sm = find(&docs, "ServiceMonitor", "qc-queue-consumer-operator");
    let svc = find(&docs, "Service", "qc-queue-consumer-operator-metrics");
    let deployment = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], json!([NS]));
    // The ServiceMonitor's selector picks the Service, whose selector picks the controller pods.
    let subset = |small: &Value, big: &Value| {
        small
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| big.get(k) == Some(v))
    };
    assert!(subset(
        &sm["spec"]["selector"]["matchLabels"],
        &svc["metadata"]["labels"]
    ));
    assert!(subset(
        &svc["spec"]["selector"],
        &deployment["spec"]["template"]["metadata"]["labels"]
    ));
    let endpoints = sm["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 1);
    let ep = endpoints[0].as_object().unwrap();
    // Only fields of the monitoring.coreos.com/v1 Endpoint type (the kind has no schema in kubernetes-validate).
    let known: BTreeSet<&str> = [
        "port",
        "path",
        "interval",
        "scrapeTimeout",
        "relabelings",
        "metricRelabelings",
        "honorLabels",
    ]
    .into();
    assert!(ep.keys().all(|k| known.contains(k.as_str())), "{ep:?}");
    assert_eq!(ep["port"], svc["spec"]["ports"][0]["name"]);
    assert_eq!(ep["path"], "/metrics");
    // The per-QueueConsumer series carry their own `namespace` label: kept, not renamed exported_namespace.
    assert_eq!(ep["honorLabels"], true);
    assert_eq!(
        svc["spec"]["ports"][0]["targetPort"],
        container(deployment)["ports"][0]["name"]
    );
    let spec_keys: BTreeSet<&str> = sm["spec"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        spec_keys,
        ["endpoints", "namespaceSelector", "selector"].into()
    );
}

#[test]
fn chart_notes_name_the_next_commands() {
    let Some(helm) = tool("helm") else { return };
    let out = Command::new(helm)
        .args([
            "install",
            "qc",
            CHART,
            "--namespace",
            NS,
            "--dry-run=client",
        ])
        .current_dir(repo(""))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let notes = text.split("NOTES:").nth(1).expect("helm prints NOTES");
    assert!(notes.contains(&format!(
        "kubectl -n {NS} rollout status deployment/qc-queue-consumer-operator"
    )));
    assert!(notes.contains("kubectl wait --for=condition=Ready queueconsumer/"));
}

/// `kubectl kustomize` of an overlay over a copy of config/: its `images:` entry must reach the worker
/// image too, and its namespace every binding subject.
#[test]
fn kustomize_overlay_moves_image_and_namespace_together() {
    let Some(kubectl) = tool("kubectl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&repo("config"), &dir.path().join("config"));
    let overlay = dir.path().join("overlay");
    std::fs::create_dir(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: queues\n\
         resources: [../config/default]\nimages:\n  - name: queue-consumer-operator\n    \
         newName: registry.example/qc\n    newTag: \"9.9.9\"\n",
    )
    .unwrap();
    let out = Command::new(kubectl)
        .args(["kustomize"])
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = yaml_docs(&String::from_utf8(out.stdout).unwrap());
    let d = find(&docs, "Deployment", "qc-operator");
    assert_eq!(d["metadata"]["namespace"], "queues");
    assert_eq!(container(d)["image"], "registry.example/qc:9.9.9");
    let worker_image = container(d)["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "QC_WORKER_IMAGE")
        .unwrap();
    assert_eq!(worker_image["value"], "registry.example/qc:9.9.9");
    assert!(args(d).contains(&"--lease-namespace=$(POD_NAMESPACE)".to_string()));
    for (kind, name) in [
        ("ClusterRoleBinding", "qc-operator"),
        ("RoleBinding", "qc-operator-leader-election"),
    ] {
        assert_eq!(
            find(&docs, kind, name)["subjects"][0]["namespace"],
            "queues"
        );
    }
    let ns = find(&docs, "Namespace", "queues");
    assert_eq!(
        ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    let crd = find(
        &docs,
        "CustomResourceDefinition",
        "queueconsumers.sqs.consumers.dev",
    );
    assert!(
        normalized(&crd["spec"]) == normalized(&generated_crd()["spec"]),
        "config/default renders a CRD that differs from the types: {SYNC}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Statically, wherever the tests run: the Dockerfile builds and installs exactly the binaries the chart
/// and the controller's pod layout expect, and runs as uid 65532 (tests/image.rs builds and runs it where
/// podman works).
#[test]
fn dockerfile_image_holds_the_bins_and_runs_as_nonroot() {
    let text = read("Dockerfile").replace("\\\n", " ");
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let last_from = lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap();
    assert_eq!(
        lines[last_from], "FROM ${BASE_IMAGE}",
        "final stage on the BASE_IMAGE argument"
    );
    assert!(
        lines.contains(&"ARG BASE_IMAGE=scratch"),
        "the final stage's base defaults to an empty image"
    );
    let final_stage = &lines[last_from + 1..];
    let users: Vec<_> = final_stage
        .iter()
        .filter_map(|l| l.strip_prefix("USER "))
        .collect();
    assert_eq!(users, ["65532:65532"], "numeric non-root user, set once");
    // One binary under every name (docs/image.md): the build stage's bin/ directory, copied whole so
    // its symlinks stay links.
    assert!(
        final_stage.contains(&"COPY --from=binaries /out/bin/ /usr/local/bin/"),
        "INTERFACES.md: binaries at /usr/local/bin/qc-operator and /usr/local/bin/qc-worker"
    );
    assert!(
        !final_stage
            .iter()
            .any(|l| l.starts_with("COPY ") && l.contains("/usr/local/bin/qc-")),
        "no binary copied on its own beside the bin/ directory"
    );
    assert!(final_stage.contains(&r#"ENTRYPOINT ["/usr/local/bin/qc-operator"]"#));

    let build = lines[..last_from]
        .iter()
        .find(|l| l.contains("cargo build"))
        .expect("a cargo build step");
    assert!(build.contains("--release") && build.contains("--locked"));
    let built: BTreeSet<String> = build
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter(|w| w[0] == "--bin")
        .map(|w| w[1].to_string())
        .collect();
    assert_eq!(
        built,
        ["qc-operator".to_string()].into(),
        "the image's one binary"
    );
    assert!(build.contains(r#"cp "target/$target/release/qc-operator" /out/bin/"#));
    // Every other bin target of the crate is a name of that binary in the image: a link, and a name
    // qc-operator's main dispatches on (src/bin/qc-operator.rs).
    let dispatch = read("src/bin/qc-operator.rs");
    for name in crate_bin_targets() {
        if name == "qc-operator" {
            continue;
        }
        assert!(
            build.contains(&format!("ln -s qc-operator /out/bin/{name}")),
            "the Dockerfile links {name} to qc-operator: add `ln -s qc-operator /out/bin/{name}` to its build step"
        );
        assert!(
            dispatch.contains(&format!("n.starts_with(\"{name}\")")),
            "qc-operator runs as {name} when started under that name"
        );
    }

    let ignored = read(".dockerignore");
    for must in ["target/", ".git/"] {
        assert!(ignored.lines().any(|l| l.trim() == must), "{must}");
    }
}

/// The crate's bin targets, as cargo sees them (explicit `[[bin]]` sections and `src/bin/*` alike).
fn crate_bin_targets() -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .arg("--manifest-path")
        .arg(repo("Cargo.toml"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let bins: BTreeSet<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!bins.is_empty(), "cargo metadata lists no bin target");
    bins
}

/// Metric names a text exposition declares (`# TYPE`), with a histogram's `_bucket`, `_sum`, `_count`.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        {
            out.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    out.insert(format!("{name}{suffix}"));
                }
            }
        }
    }
    out
}

/// `qc_...` identifiers in a PromQL expression.
fn metric_names_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let bytes = expr.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b':';
    let mut i = 0;
    while i < bytes.len() {
        if expr[i..].starts_with("qc_") && (i == 0 || !ident(bytes[i - 1])) {
            let end = (i..bytes.len())
                .find(|j| !ident(bytes[*j]))
                .unwrap_or(bytes.len());
            out.insert(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn chart_dashboard_and_alert_rules_use_only_metrics_the_binaries_export() {
    let Some(docs) = render(&[
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    ]) else {
        return;
    };
    let docs = docs.unwrap();
    let rule = find(&docs, "PrometheusRule", "qc-queue-consumer-operator");
    let dashboard = find(&docs, "ConfigMap", "qc-queue-consumer-operator-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value = serde_json::from_str(
        dashboard["data"]["queue-consumer-operator.json"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let mut exprs: Vec<String> = Vec::new();
    for r in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        exprs.push(r["expr"].as_str().unwrap().to_string());
    }
    for p in json["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push(t["expr"].as_str().unwrap().to_string());
        }
    }
    for v in json["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            exprs.push(q.to_string());
        }
    }
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names_in(e)).collect();
    // What the two binaries serve on /metrics (the controller's per-consumer families are declared
    // even before any QueueConsumer exists).
    let mut exported = exported_names(&qc::controller::Metrics::default().render());
    exported.extend(exported_names(
        &qc::worker::metrics::Metrics::default().render(),
    ));
    let mut process = qc::telemetry::Exposition::new();
    qc::controller::run::render_process_state(&mut process, false, (0, 0));
    exported.extend(exported_names(&process.finish()));
    exported.extend(exported_names(&qc::aws::limit::render_metrics(&[])));
    let unknown: Vec<&String> = used.difference(&exported).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard or the rules use metrics no binary exports: {unknown:?}"
    );
    // The checks have something to check: every panel, every alert.
    assert_eq!(
        rule["spec"]["groups"][0]["rules"].as_array().unwrap().len(),
        9
    );
    assert!(used.len() >= 12, "{used:?}");
    assert!(
        metric_names_in("rate(qc_x_total[5m]) / qc_y")
            == ["qc_x_total".to_string(), "qc_y".to_string()].into()
    );
}

/// #29 item 3: the optional ValidatingAdmissionPolicy narrows the controller's service account below
/// RBAC. Its expressions are evaluated here with a CEL interpreter against the requests the
/// controller makes (allowed) and the ones a stolen token would (denied).
#[test]
fn chart_admission_policy_lets_the_controller_touch_only_its_own() {
    let Some(docs) = render(&["--set", "rbac.admissionPolicy.enabled=true"]) else {
        return;
    };
    let docs = docs.unwrap();
    let name = "qc-queue-consumer-operator-least-privilege";
    let policy = find(&docs, "ValidatingAdmissionPolicy", name);
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", name);
    assert_eq!(binding["spec"]["policyName"], name);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    assert_eq!(policy["spec"]["failurePolicy"], "Fail");
    // Off by default.
    let plain = render(&[]).unwrap().unwrap();
    assert!(kinds(&plain, "ValidatingAdmissionPolicy").is_empty());

    let expressions = |list: &Value| -> Vec<cel::Program> {
        list.as_array()
            .unwrap()
            .iter()
            .map(|v| cel::Program::compile(v["expression"].as_str().unwrap()).unwrap())
            .collect()
    };
    let matches = expressions(&policy["spec"]["matchConditions"]);
    let validations = expressions(&policy["spec"]["validations"]);
    let eval = |p: &cel::Program, user: &str, op: &str, res: &str, object: &Value, old: &Value| {
        let mut ctx = cel::Context::default();
        ctx.add_variable(
            "request",
            json!({"userInfo": {"username": user}, "operation": op, "resource": {"resource": res}}),
        )
        .unwrap();
        ctx.add_variable("object", object.clone()).unwrap();
        ctx.add_variable("oldObject", old.clone()).unwrap();
        match p.execute(&ctx) {
            Ok(cel::Value::Bool(b)) => b,
            other => panic!("not a bool: {other:?}"),
        }
    };
    let controller = format!("system:serviceaccount:{NS}:qc-queue-consumer-operator");
    // Allowed: every validation holds (for the controller, which every match condition selects).
    let allowed = |op: &str, res: &str, object: Value, old: Value| {
        assert!(
            matches
                .iter()
                .all(|p| eval(p, &controller, op, res, &object, &old))
        );
        validations
            .iter()
            .all(|p| eval(p, &controller, op, res, &object, &old))
    };
    let owned = json!({"metadata": {"name": "orders", "ownerReferences": [
        {"apiVersion": "sqs.consumers.dev/v1alpha1", "kind": "QueueConsumer", "name": "orders", "uid": "u", "controller": true}
    ]}, "spec": {"replicas": 2}});
    let foreign = json!({"metadata": {"name": "payments"}, "spec": {"replicas": 2}});
    let null = Value::Null;
    assert!(allowed(
        "CREATE",
        "deployments",
        owned.clone(),
        null.clone()
    ));
    assert!(allowed(
        "UPDATE",
        "deployments",
        owned.clone(),
        owned.clone()
    ));
    assert!(allowed(
        "DELETE",
        "deployments",
        null.clone(),
        owned.clone()
    ));
    assert!(!allowed(
        "CREATE",
        "deployments",
        foreign.clone(),
        null.clone()
    ));
    assert!(!allowed(
        "UPDATE",
        "deployments",
        foreign.clone(),
        foreign.clone()
    ));
    assert!(!allowed(
        "DELETE",
        "deployments",
        null.clone(),
        foreign.clone()
    ));
    // Taking over a foreign Deployment by adding an owner reference is an update of a foreign one.
    assert!(!allowed(
        "UPDATE",
        "deployments",
        owned.clone(),
        foreign.clone()
    ));

    let pod = |cost: Option<&str>, extra: &[(&str, &str)], labels: Value, image: &str| {
        let mut annotations = serde_json::Map::new();
        if let Some(c) = cost {
            annotations.insert(
                "controller.kubernetes.io/pod-deletion-cost".into(),
                json!(c),
            );
        }
        for (k, v) in extra {
            annotations.insert((*k).into(), json!(v));
        }
        json!({"metadata": {"name": "orders-1", "labels": labels, "annotations": annotations},
               "spec": {"containers": [{"name": "qc-worker", "image": image}]}})
    };
    let labels = json!({"app.kubernetes.io/instance": "orders"});
    let before = pod(None, &[("team", "a")], labels.clone(), "qc:1");
    // The deletion cost, set, changed or removed: allowed.
    assert!(allowed(
        "UPDATE",
        "pods",
        pod(Some("-5"), &[("team", "a")], labels.clone(), "qc:1"),
        before.clone()
    ));
    assert!(allowed(
        "UPDATE",
        "pods",
        before.clone(),
        pod(Some("3"), &[("team", "a")], labels.clone(), "qc:1")
    ));
    // processing.maxRate's share, set or changed: allowed.
    assert!(allowed(
        "UPDATE",
        "pods",
        pod(
            None,
            &[("team", "a"), ("sqs.consumers.dev/rate-share", "6.667")],
            labels.clone(),
            "qc:1"
        ),
        before.clone()
    ));
    // Anything else: denied.
    assert!(!allowed(
        "UPDATE",
        "pods",
        pod(None, &[("team", "b")], labels.clone(), "qc:1"),
        before.clone()
    ));
    assert!(!allowed(
        "UPDATE",
        "pods",
        pod(None, &[], labels.clone(), "qc:1"),
        before.clone()
    ));
    assert!(!allowed(
        "UPDATE",
        "pods",
        pod(None, &[("team", "a"), ("x", "y")], labels.clone(), "qc:1"),
        before.clone()
    ));
    assert!(!allowed(
        "UPDATE",
        "pods",
        pod(
            None,
            &[("team", "a")],
            json!({"app.kubernetes.io/instance": "payments"}),
            "qc:1"
        ),
        before.clone()
    ));
    assert!(!allowed(
        "UPDATE",
        "pods",
        pod(None, &[("team", "a")], labels.clone(), "evil:1"),
        before.clone()
    ));
    // Other users are not matched at all: RBAC alone decides for them.
    assert!(!matches.iter().all(|p| eval(
        p,
        "system:serviceaccount:team-a:default",
        "UPDATE",
        "pods",
        &before,
        &before
    )));
}

/// The values a corporate install adds (issue 45), all at once: the file a user would write.
const CORPORATE_VALUES: &str = r#"
commonLabels: {team: platform, cost-center: "42"}
extraEnv: [{name: SSL_CERT_FILE, value: /etc/qc-ca/ca-bundle.crt}]
envFrom: [{secretRef: {name: qc-proxy}}, {configMapRef: {name: qc-env}, prefix: QC_}]
extraVolumes: [{name: corporate-ca, configMap: {name: corporate-ca}}]
extraVolumeMounts: [{name: corporate-ca, mountPath: /etc/qc-ca, readOnly: true}]
networkPolicy:
  enabled: true
  metricsFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}]
  extraEgress: [{to: [{ipBlock: {cidr: 10.0.0.0/8}}], ports: [{port: 3128, protocol: TCP}]}]
metrics:
  serviceMonitor: {enabled: true, namespace: monitoring, labels: {release: prometheus}}
  podMonitor: {enabled: true, namespace: monitoring}
  prometheusRule:
    enabled: true
    namespace: monitoring
    alertLabels: {team: platform, severity: page}
    perAlertLabels: {QueueConsumerQueueUnreachable: {severity: critical, pager: "true"}}
  grafanaDashboard: {enabled: true}
podDisruptionBudget: {enabled: true}
rbac: {admissionPolicy: {enabled: true}}
"#;

fn render_values(yaml: &str, more: &[&str]) -> Option<Result<Vec<Value>, String>> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, yaml).unwrap();
    let mut args = vec!["-f", file.to_str().unwrap()];
    args.extend_from_slice(more);
    render(&args)
}

#[test]
fn chart_common_labels_reach_every_object_and_the_pods_but_not_the_selector() {
    let Some(docs) = render_values(CORPORATE_VALUES, &[]) else {
        return;
    };
    let docs = docs.unwrap();
    assert!(docs.len() >= 15, "{} documents", docs.len());
    for d in &docs {
        let labels = &d["metadata"]["labels"];
        assert_eq!(
            labels["team"], "platform",
            "{} {}",
            d["kind"], d["metadata"]["name"]
        );
        assert_eq!(labels["cost-center"], "42", "{}", d["kind"]);
    }
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert_eq!(
        d["spec"]["template"]["metadata"]["labels"]["team"],
        "platform"
    );
    // The selector is immutable: a label added later must not change it.
    assert!(d["spec"]["selector"]["matchLabels"].get("team").is_none());
    let defaults = render(&[]).unwrap().unwrap();
    let plain = find(&defaults, "Deployment", "qc-queue-consumer-operator");
    assert_eq!(d["spec"]["selector"], plain["spec"]["selector"]);
}

#[test]
fn chart_extra_env_env_from_and_volumes_reach_the_controller_container() {
    let Some(docs) = render_values(CORPORATE_VALUES, &[]) else {
        return;
    };
    let docs = docs.unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    let c = container(d);
    let env = c["env"].as_array().unwrap();
    // The chart's own variables stay, the extra ones come after them.
    assert_eq!(env[0]["name"], "POD_NAMESPACE");
    assert_eq!(
        env.last().unwrap(),
        &json!({"name": "SSL_CERT_FILE", "value": "/etc/qc-ca/ca-bundle.crt"})
    );
    assert_eq!(
        c["envFrom"],
        json!([{"secretRef": {"name": "qc-proxy"}}, {"configMapRef": {"name": "qc-env"}, "prefix": "QC_"}])
    );
    assert_eq!(
        c["volumeMounts"],
        json!([{"name": "corporate-ca", "mountPath": "/etc/qc-ca", "readOnly": true}])
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["volumes"],
        json!([{"name": "corporate-ca", "configMap": {"name": "corporate-ca"}}])
    );
    // The root filesystem stays read-only: the CA comes in as a volume.
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);

    let defaults = render(&[]).unwrap().unwrap();
    let d = find(&defaults, "Deployment", "qc-queue-consumer-operator");
    let c = container(d);
    for absent in ["envFrom", "volumeMounts"] {
        assert!(c.get(absent).is_none(), "{absent}: {}", c[absent]);
    }
    assert!(d["spec"]["template"]["spec"].get("volumes").is_none());
}

#[test]
fn chart_network_policy_lets_in_the_metrics_port_and_out_dns_api_aws_and_the_workers() {
    let Some(defaults) = render(&[]) else { return };
    assert!(kinds(&defaults.unwrap(), "NetworkPolicy").is_empty());
    let docs = render_values(CORPORATE_VALUES, &[]).unwrap().unwrap();
    let np = find(&docs, "NetworkPolicy", "qc-queue-consumer-operator");
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert_eq!(np["metadata"]["namespace"], NS);
    // It selects the controller pods, and only them.
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"],
        d["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    let ingress = np["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1);
    assert_eq!(
        ingress[0]["ports"],
        json!([{"port": container(d)["ports"][0]["name"], "protocol": "TCP"}])
    );
    assert_eq!(
        ingress[0]["from"],
        json!([{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}])
    );
    let egress = np["spec"]["egress"].as_array().unwrap();
    let ports = |rule: &Value| -> Vec<(Value, Value)> {
        rule["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["port"].clone(), p["protocol"].clone()))
            .collect()
    };
    assert_eq!(
        ports(&egress[0]),
        vec![(json!(53), json!("UDP")), (json!(53), json!("TCP"))]
    );
    assert_eq!(
        ports(&egress[1]),
        vec![(json!(443), json!("TCP")), (json!(6443), json!("TCP"))]
    );
    // The scrape of the worker pods: their port and their labels, as render makes them.
    let qc = qc::api::QueueConsumer::new(
        "orders",
        serde_json::from_value(json!({
            "queue": {"url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"},
            "processing": {"p99": "1s"},
            "handler": {"http": {}},
            "template": {"spec": {"containers": [{"name": "app", "image": "app:1"}]}}
        }))
        .unwrap(),
    );
    let worker = serde_json::to_value(
        qc::render::deployment(&qc, &qc::render::RenderOptions::default()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        ports(&egress[2]),
        vec![(json!(qc::render::METRICS_PORT_NAME), json!("TCP"))]
    );
    let peer = &egress[2]["to"][0];
    assert_eq!(peer["namespaceSelector"], json!({}));
    for (k, v) in peer["podSelector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &worker["spec"]["template"]["metadata"]["labels"][k], v,
            "{k}"
        );
    }
    assert_eq!(
        egress[3]["ports"],
        json!([{"port": 3128, "protocol": "TCP"}])
    );
    assert_eq!(egress.len(), 4);

    // Namespaced mode: the scrape goes only to the watched namespaces.
    let docs = render(&[
        "--set",
        "networkPolicy.enabled=true",
        "--set-json",
        r#"watchNamespaces=["team-a","team-b"]"#,
    ])
    .unwrap()
    .unwrap();
    let np = find(&docs, "NetworkPolicy", "qc-queue-consumer-operator");
    let names: Vec<&Value> = np["spec"]["egress"][2]["to"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| &p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"])
        .collect();
    assert_eq!(names, vec!["team-a", "team-b"]);
    // No metricsFrom: any source may reach the metrics port (and only that port).
    assert!(np["spec"]["ingress"][0].get("from").is_none());
}

#[test]
fn chart_monitoring_objects_go_to_their_namespace_with_labels_per_alert() {
    let Some(docs) = render_values(CORPORATE_VALUES, &[]) else {
        return;
    };
    let docs = docs.unwrap();
    let sm = find(&docs, "ServiceMonitor", "qc-queue-consumer-operator");
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    // It still scrapes the Service in the release namespace.
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], json!([NS]));
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    let pm = find(&docs, "PodMonitor", "qc-queue-consumer-operator-workers");
    assert_eq!(pm["metadata"]["namespace"], "monitoring");
    let rule = find(&docs, "PrometheusRule", "qc-queue-consumer-operator");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    let alerts = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    assert_eq!(alerts.len(), 9);
    for alert in alerts {
        let name = alert["alert"].as_str().unwrap();
        let labels = &alert["labels"];
        assert_eq!(labels["team"], "platform", "{name}");
        if name == "QueueConsumerQueueUnreachable" {
            assert_eq!(
                labels,
                &json!({"team": "platform", "severity": "critical", "pager": "true"})
            );
        } else {
            // alertLabels win over an alert's own severity.
            assert_eq!(
                labels,
                &json!({"team": "platform", "severity": "page"}),
                "{name}"
            );
        }
    }

    // By default: the release namespace, and each alert's own severity alone.
    let docs = render(&["--set", "metrics.prometheusRule.enabled=true"])
        .unwrap()
        .unwrap();
    let rule = find(&docs, "PrometheusRule", "qc-queue-consumer-operator");
    assert_eq!(rule["metadata"]["namespace"], NS);
    let severities: Vec<(&str, &Value)> = rule["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| (a["alert"].as_str().unwrap(), &a["labels"]))
        .collect();
    for (name, labels) in severities {
        let want = if [
            "QueueConsumerQueueUnreachable",
            "QueueConsumerDwellObjectiveBurningFast",
            "QueueConsumerOperatorNoLeader",
        ]
        .contains(&name)
        {
            "critical"
        } else {
            "warning"
        };
        assert_eq!(labels, &json!({"severity": want}), "{name}");
    }
}

#[test]
fn chart_refuses_bad_new_values_naming_the_field() {
    let cases: &[(&[&str], &str)] = &[
        // Helm 4 names the key but not always its place for a propertyNames error (its schema library
        // reports another instance location), so the key itself is what the message must hold.
        (&["--set", "commonLabels.bad key=x"], "'bad key'"),
        (
            &["--set-json", r#"extraVolumeMounts=[{"name":"ca"}]"#],
            "mountPath",
        ),
        (
            &["--set-json", r#"extraVolumes=[{"configMap":{}}]"#],
            "name",
        ),
        (
            &["--set-json", r#"envFrom=[{"secret":{"name":"x"}}]"#],
            "envFrom",
        ),
        (&["--set-json", r#"extraEnv=[{"value":"x"}]"#], "name"),
        (&["--set", "env[0].name=X"], "env"),
        (
            &["--set-json", "networkPolicy.egressPorts=[0]"],
            "egressPorts",
        ),
        (&["--set", "networkPolicy.egress=true"], "egress"),
        (
            &["--set", "metrics.serviceMonitor.namespace=Monitoring"],
            "namespace",
        ),
        (
            &[
                "--set",
                "metrics.prometheusRule.perAlertLabels.QueueConsumerDLQNotEmpty.team=x",
            ],
            "'QueueConsumerDLQNotEmpty'",
        ),
    ];
    for (args, field) in cases {
        let Some(result) = render(args) else { return };
        match result {
            Ok(_) => panic!("helm template {args:?} rendered; it must fail"),
            Err(msg) => assert!(msg.contains(field), "{args:?}: {msg}"),
        }
    }
}

/// Every key of values.yaml, as serde reads it: dotted paths, maps of keys descended into.
fn value_keys(prefix: &str, value: &Value, out: &mut Vec<String>) {
    if let Some(map) = value.as_object() {
        for (k, v) in map {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            out.push(path.clone());
            if v.as_object().is_some_and(|m| !m.is_empty()) {
                value_keys(&path, v, out);
            }
        }
    }
}

fn chart_readme(root: &Path) -> std::process::Output {
    Command::new("python3")
        .arg(root.join("scripts/chart-readme"))
        .arg("--check")
        .output()
        .expect("run python3 scripts/chart-readme")
}

#[test]
fn chart_readme_values_table_is_made_from_values_yaml() {
    let out = chart_readme(&repo(""));
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // Every key serde finds in values.yaml has its row, and no row names a key that is not there.
    let values: Value = serde_saphyr::from_str(&read(&format!("{CHART}/values.yaml"))).unwrap();
    let mut keys = Vec::new();
    value_keys("", &values, &mut keys);
    let readme = read(&format!("{CHART}/README.md"));
    let rows: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once("` |").map(|(k, _)| k))
        .collect();
    let row_set: BTreeSet<&str> = rows.iter().copied().collect();
    assert_eq!(
        row_set.len(),
        rows.len(),
        "a key twice in the table: {rows:?}"
    );
    let key_set: BTreeSet<&str> = keys.iter().map(String::as_str).collect();
    assert_eq!(row_set, key_set);
    assert!(keys.len() > 100, "{} keys", keys.len());

    // The check fails on drift: a changed default, and a new key, in a copy of the chart.
    for (change, expect) in [
        (("replicaCount: 1\n", "replicaCount: 2\n"), "replicaCount"),
        (
            ("commonLabels: {}\n", "commonLabels: {}\nnewKey: 1\n"),
            "newKey",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("scripts")).unwrap();
        std::fs::copy(
            repo("scripts/chart-readme"),
            root.join("scripts/chart-readme"),
        )
        .unwrap();
        let chart = root.join(CHART);
        std::fs::create_dir_all(&chart).unwrap();
        std::fs::copy(repo(&format!("{CHART}/README.md")), chart.join("README.md")).unwrap();
        let values = read(&format!("{CHART}/values.yaml"));
        assert!(values.contains(change.0), "{change:?}");
        std::fs::write(
            chart.join("values.yaml"),
            values.replacen(change.0, change.1, 1),
        )
        .unwrap();
        let out = chart_readme(root);
        assert!(!out.status.success(), "{change:?} passed the check");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(expect),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
}

/// What the release workflow does to the chart before `helm package` (scripts/chart-release): the image
/// from the registry, and Chart.yaml naming the repository, its icon and its Artifact Hub links.
#[test]
fn chart_release_names_the_repository_registry_and_icon_and_lints_strict() {
    let Some(helm) = tool("helm") else { return };
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("queue-consumer-operator");
    copy_dir(&repo(CHART), &chart);
    let repository = "https://github.com/example/queue-consumer-operator";
    let out = Command::new("bash")
        .arg(repo("scripts/chart-release"))
        .arg(&chart)
        .args([repository, "registry.example/example", "0.1.0"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart.join("Chart.yaml")).unwrap())
            .unwrap();
    assert_eq!(meta["home"], repository);
    assert_eq!(meta["sources"], json!([repository]));
    let icon = meta["icon"].as_str().unwrap();
    let icon_path = icon
        .strip_prefix(&format!("{repository}/raw/v0.1.0/"))
        .unwrap_or_else(|| panic!("{icon}"));
    assert!(repo(icon_path).is_file(), "{icon_path}");
    let images: Value = serde_saphyr::from_str(
        meta["annotations"]["artifacthub.io/images"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let image = "registry.example/example/queue-consumer-operator:0.1.0";
    assert_eq!(images[0]["image"], image);
    let links: Value = serde_saphyr::from_str(
        meta["annotations"]["artifacthub.io/links"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(links[0]["url"], repository);
    // The Artifact Hub CRD example is the README's QueueConsumer, valid for `qc-operator check`.
    let example: Value = serde_saphyr::from_str(
        meta["annotations"]["artifacthub.io/crdsExamples"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let file = dir.path().join("example.yaml");
    std::fs::write(&file, serde_json::to_string(&example[0]).unwrap()).unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .arg("check")
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    let lint = Command::new(&helm)
        .args(["lint", "--strict"])
        .arg(&chart)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&lint.stdout);
    assert!(lint.status.success(), "{said}");
    assert!(!said.contains("icon is recommended"), "{said}");
    let docs = render_chart(&chart, &[]).unwrap().unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert_eq!(container(d)["image"], image);

    // Once only: a second run would write every key twice.
    let again = Command::new("bash")
        .arg(repo("scripts/chart-release"))
        .arg(&chart)
        .args([repository, "registry.example/example", "0.1.0"])
        .output()
        .unwrap();
    assert!(!again.status.success());
}

/// #44 item 4: the chart's duration values (passed to `qc-operator run`, which reads them with the
/// API's parser) take the same grammar as the CRD: `1.5m` renders, `1.5x` is refused by the values
/// schema, and the schema's patterns are the API's.
#[test]
fn chart_duration_values_take_the_apis_grammar() {
    let schema: Value =
        serde_json::from_str(&read(&format!("{CHART}/values.schema.json"))).unwrap();
    let props = &schema["properties"];
    for pattern in [
        &props["reconcileTimeout"]["pattern"],
        &props["aws"]["properties"]["alarmResync"]["pattern"],
    ] {
        assert_eq!(pattern, qc::api::DURATION_PATTERN);
    }
    let terms = qc::api::DURATION_PATTERN
        .strip_prefix('^')
        .and_then(|p| p.strip_suffix('$'))
        .unwrap();
    assert_eq!(
        props["limits"]["properties"]["minPollInterval"]["pattern"],
        format!("^({terms})?$")
    );
    let Some(docs) = render(&["--set", "reconcileTimeout=1.5m"]) else {
        return;
    };
    let docs = docs.unwrap();
    let d = find(&docs, "Deployment", "qc-queue-consumer-operator");
    assert!(args(d).iter().any(|a| a.contains("1.5m")), "{:?}", args(d));
    assert!("1.5m".parse::<qc::api::Duration>().is_ok());
    let refused = render(&["--set", "reconcileTimeout=1.5x"]).unwrap();
    let err = refused.expect_err("helm renders reconcileTimeout=1.5x");
    assert!(err.contains("reconcileTimeout"), "{err}");
}
