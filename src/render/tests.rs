use crate::api::Quantity;
use serde_json::{Value, json};

use super::*;

fn qc(spec: Value) -> QueueConsumer {
    let mut qc: QueueConsumer = serde_json::from_value(json!({
        "apiVersion": "sqs.consumers.dev/v1alpha1",
        "kind": "QueueConsumer",
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": spec,
    }))
    .unwrap();
    qc.metadata.generation = Some(1);
    qc
}

fn http_spec() -> Value {
    json!({
        "queue": {"url": "https://sqs.us-east-1.amazonaws.com/123456789012/orders"},
        "processing": {"p99": "2s"},
        "handler": {"http": {"port": 8080, "path": "/messages"}},
        "template": {"spec": {"containers": [{"name": "app", "image": "shop/orders:1"}]}}
    })
}

fn exec_spec() -> Value {
    json!({
        "queue": {"url": "https://sqs.eu-west-1.amazonaws.com/123456789012/orders", "endpoint": "http://localstack:4566"},
        "processing": {"p99": "2s", "timeout": "1m", "waitTime": "10s"},
        "handler": {"exec": {"command": ["/app/handle", "--fast"]}},
        "template": {"spec": {"containers": [
            {"name": "app", "image": "shop/orders:1", "command": ["/app/server"],
             "env": [{"name": "AWS_REGION", "value": "wrong"}, {"name": "KEEP", "value": "1"}]},
            {"name": "sidecar", "image": "proxy:1"}
        ]}}
    })
}

fn render(spec: Value) -> Deployment {
    deployment(
        &qc(spec),
        &RenderOptions {
            worker_image: "qc:test".into(),
            ..Default::default()
        },
    )
    .unwrap()
}

fn pod(d: &Deployment) -> &PodSpec {
    d.spec.template.spec.as_ref().unwrap()
}

fn arg_after<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
}

/// The worker's arguments: the `qc-worker` container's (http layout) or the user's first container's
/// (exec layout, where it runs the copied worker).
fn worker_command_line(d: &Deployment) -> Vec<String> {
    let p = pod(d);
    let c = p
        .containers
        .iter()
        .find(|c| c.name == "qc-worker")
        .unwrap_or(&p.containers[0]);
    c.args.clone().unwrap_or_default()
}

fn env_value<'a>(c: &'a Container, name: &str) -> Option<&'a str> {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
}

#[test]
fn layouts_per_handler_mode() {
    struct Case {
        name: &'static str,
        spec: Value,
        containers: &'static [&'static str],
        init: &'static [&'static str],
        /// Name of the container running qc-worker, and its command.
        worker_in: &'static str,
        worker_command: &'static str,
        tail: &'static [&'static str],
        region: Option<&'static str>,
        grace: i64,
    }
    let cases = [
        Case {
            name: "http handler: worker is a second container",
            spec: http_spec(),
            containers: &["app", "qc-worker"],
            init: &[],
            worker_in: "qc-worker",
            worker_command: WORKER_BINARY,
            tail: &["--http-url", "http://127.0.0.1:8080/messages"],
            region: Some("us-east-1"),
            // timeout 30s + waitTime 20s + drain 10s + exit 5s
            grace: 65,
        },
        Case {
            name: "exec handler: init copies the worker, the user's container runs it",
            spec: exec_spec(),
            containers: &["app", "sidecar"],
            init: &["qc-worker-install"],
            worker_in: "app",
            worker_command: COPIED_WORKER_BINARY,
            tail: &["--exec", "--", "/app/handle", "--fast"],
            region: Some("eu-west-1"),
            // 60s + 10s + 10s + 5s
            grace: 85,
        },
    ];
    for case in cases {
        let d = render(case.spec);
        let p = pod(&d);
        let names: Vec<_> = p.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, case.containers, "{}", case.name);
        let init: Vec<_> = p
            .init_containers
            .iter()
            .flatten()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(init, case.init, "{}", case.name);
        let w = p
            .containers
            .iter()
            .find(|c| c.name == case.worker_in)
            .unwrap();
        assert_eq!(
            w.command.as_deref(),
            Some(&[case.worker_command.to_string()][..]),
            "{}",
            case.name
        );
        let args = w.args.as_ref().unwrap();
        assert!(
            args.ends_with(
                &case
                    .tail
                    .iter()
                    .map(std::string::ToString::to_string)
                    .collect::<Vec<_>>()
            ),
            "{}: {args:?}",
            case.name
        );
        assert_eq!(arg_after(args, "--region"), case.region, "{}", case.name);
        assert_eq!(env_value(w, "AWS_REGION"), case.region, "{}", case.name);
        assert_eq!(
            arg_after(args, "--metrics-addr"),
            Some("0.0.0.0:9090"),
            "{}",
            case.name
        );
        let probe = w
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap();
        assert_eq!(probe.path.as_deref(), Some("/readyz"));
        assert_eq!(probe.port, IntOrString::Int(9090));
        assert_eq!(
            w.liveness_probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .as_deref(),
            Some("/healthz")
        );
        assert_eq!(
            p.termination_grace_period_seconds,
            Some(case.grace),
            "{}",
            case.name
        );
        let spec = &d.spec;
        assert_eq!(spec.replicas, None, "render never sets replicas");
        assert_eq!(
            spec.selector.match_labels.as_ref().unwrap(),
            &selector_labels("orders")
        );
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        for (k, v) in labels("orders") {
            assert_eq!(pod_labels.get(&k), Some(&v), "{}: pod label {k}", case.name);
        }
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("QueueConsumer", "orders", "u-1")
        );
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
        assert_eq!(d.metadata.namespace.as_deref(), Some("shop"));
    }
}

#[test]
fn command_line_carries_every_setting() {
    let mut spec = http_spec();
    spec["processing"] = json!({
        "p99": "2s", "timeout": "45s", "concurrency": 4, "batchSize": 5, "waitTime": "5s",
        "heartbeat": {"enabled": false, "interval": "10s"},
        "retryBackoff": {"base": "1s", "max": "2m"}, "onPoison": "leave"
    });
    spec["idempotency"] = json!({"store": "memory", "key": "jsonPointer:/orderId", "ttl": "1h"});
    let d = render(spec);
    let w = &pod(&d).containers[1];
    let args = w.args.as_ref().unwrap();
    let expected = [
        (
            "--queue-url",
            "https://sqs.us-east-1.amazonaws.com/123456789012/orders",
        ),
        ("--concurrency", "4"),
        ("--batch-size", "5"),
        ("--wait-time", "5s"),
        ("--timeout", "45s"),
        ("--heartbeat", "false"),
        ("--heartbeat-interval", "10s"),
        ("--retry-base", "1s"),
        ("--retry-max", "2m"),
        ("--on-poison", "leave"),
        ("--idempotency-store", "memory"),
        ("--idempotency-key", "jsonPointer:/orderId"),
        ("--idempotency-ttl", "1h"),
        // 45s + 5s + 10s
        ("--shutdown-timeout", "1m"),
    ];
    for (flag, value) in expected {
        assert_eq!(arg_after(args, flag), Some(value), "{flag} in {args:?}");
    }
    assert_eq!(arg_after(args, "--endpoint-url"), None);
    // Every flag appears once.
    let flags: Vec<_> = args.iter().filter(|a| a.starts_with("--")).collect();
    let mut dedup = flags.clone();
    dedup.sort();
    dedup.dedup();
    assert_eq!(flags.len(), dedup.len(), "{args:?}");
}

#[test]
fn the_breaker_and_outage_tolerance_reach_the_worker() {
    // Defaults: on, spelled out; no tolerance flag (the worker's own default, 1h, applies).
    let d = render(http_spec());
    let args = pod(&d).containers[1].args.clone().unwrap();
    for (flag, value) in [
        ("--breaker", "true"),
        ("--breaker-failure-percent", "50"),
        ("--breaker-window", "20"),
        ("--breaker-consecutive", "10"),
        ("--breaker-probe-base", "1s"),
        ("--breaker-probe-max", "30s"),
    ] {
        assert_eq!(arg_after(&args, flag), Some(value), "{flag} in {args:?}");
    }
    assert_eq!(arg_after(&args, "--outage-tolerance"), None, "{args:?}");
    // The spec's values, in both layouts.
    for mut spec in [http_spec(), exec_spec()] {
        spec["processing"]["outageTolerance"] = json!("2h");
        spec["processing"]["breaker"] = json!({
            "enabled": false, "failurePercent": 80, "window": 50, "consecutiveFailures": 3,
            "probeBackoff": {"base": "500ms", "max": "2m"}
        });
        let exec = spec["handler"].get("exec").is_some();
        let d = render(spec);
        let p = pod(&d);
        let c = if exec {
            &p.containers[0]
        } else {
            &p.containers[1]
        };
        let args = c.args.clone().unwrap();
        for (flag, value) in [
            ("--breaker", "false"),
            ("--breaker-failure-percent", "80"),
            ("--breaker-window", "50"),
            ("--breaker-consecutive", "3"),
            ("--breaker-probe-base", "500ms"),
            ("--breaker-probe-max", "2m"),
            ("--outage-tolerance", "2h"),
        ] {
            assert_eq!(arg_after(&args, flag), Some(value), "{flag} in {args:?}");
        }
    }
}

#[test]
fn poison_goes_to_the_dead_letter_queue_unless_the_spec_says_otherwise() {
    let d = render(http_spec());
    let args = pod(&d).containers[1].args.clone().unwrap();
    assert_eq!(arg_after(&args, "--on-poison"), Some("dead-letter"));
    for (value, flag) in [("deadLetter", "dead-letter"), ("delete", "delete")] {
        let mut spec = http_spec();
        spec["processing"]["onPoison"] = json!(value);
        let d = render(spec);
        let args = pod(&d).containers[1].args.clone().unwrap();
        assert_eq!(arg_after(&args, "--on-poison"), Some(flag), "{value}");
    }
}

#[test]
fn http_layout_details() {
    let d = render(http_spec());
    let p = pod(&d);
    let app = &p.containers[0];
    assert_eq!(app.image.as_deref(), Some("shop/orders:1"));
    assert!(
        app.args.is_none() && app.command.is_none(),
        "user container untouched"
    );
    // The handler keeps serving while the worker drains: preStop sleeps the worker's shutdown timeout.
    let sleep = app
        .lifecycle
        .as_ref()
        .unwrap()
        .pre_stop
        .as_ref()
        .unwrap()
        .sleep
        .as_ref()
        .unwrap();
    assert_eq!(sleep.seconds, 60);
    let w = &p.containers[1];
    assert_eq!(w.image.as_deref(), Some("qc:test"));
    let sc = w.security_context.as_ref().unwrap();
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, Some(WORKER_UID));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(
        sc.capabilities.as_ref().unwrap().drop.as_deref(),
        Some(&["ALL".to_string()][..])
    );
    assert_eq!(sc.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    let env: Vec<_> = w.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(env, ["AWS_REGION", "POD_NAME", "POD_NAMESPACE"]);
}

#[test]
fn exec_layout_details() {
    let d = render(exec_spec());
    let p = pod(&d);
    let app = &p.containers[0];
    assert_eq!(
        app.image.as_deref(),
        Some("shop/orders:1"),
        "user image kept"
    );
    assert_eq!(
        env_value(app, "AWS_REGION"),
        Some("eu-west-1"),
        "ours replace theirs"
    );
    assert_eq!(env_value(app, "KEEP"), Some("1"));
    assert_eq!(
        env_value(app, "AWS_ENDPOINT_URL_SQS"),
        Some("http://localstack:4566")
    );
    let args = app.args.as_ref().unwrap();
    assert_eq!(
        arg_after(args, "--endpoint-url"),
        Some("http://localstack:4566")
    );
    let mount = &app.volume_mounts.as_ref().unwrap()[0];
    assert_eq!(
        (mount.name.as_str(), mount.mount_path.as_str()),
        (WORKER_VOLUME, WORKER_VOLUME_MOUNT)
    );
    // #29 item 4: the handler's container cannot replace the worker it runs under.
    assert_eq!(mount.read_only, Some(true));
    assert!(
        app.lifecycle.is_none(),
        "no preStop: the worker is the process"
    );
    let sidecar = &p.containers[1];
    assert!(sidecar.args.is_none() && sidecar.probes_unset());
    let install = &p.init_containers.as_ref().unwrap()[0];
    assert_eq!(install.image.as_deref(), Some("qc:test"));
    assert_eq!(
        install.command.as_ref().unwrap(),
        &[WORKER_BINARY, "--copy-self-to", COPIED_WORKER_BINARY]
    );
    assert_eq!(
        install.volume_mounts.as_ref().unwrap()[0].name,
        WORKER_VOLUME
    );
    assert_eq!(install.volume_mounts.as_ref().unwrap()[0].read_only, None);
    let vol = p
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == WORKER_VOLUME)
        .unwrap();
    assert!(vol.empty_dir.is_some());
}

trait ProbesUnset {
    fn probes_unset(&self) -> bool;
}
impl ProbesUnset for Container {
    fn probes_unset(&self) -> bool {
        self.liveness_probe.is_none() && self.readiness_probe.is_none()
    }
}

#[test]
fn user_settings_survive() {
    let mut spec = http_spec();
    spec["template"] = json!({
        "metadata": {"labels": {"team": "shop"}, "annotations": {"a": "b"}},
        "spec": {
            "serviceAccountName": "orders",
            "terminationGracePeriodSeconds": 600,
            "containers": [{"name": "app", "image": "x", "ports": [{"containerPort": 9090}],
                            "lifecycle": {"preStop": {"exec": {"command": ["/drain"]}}}}]
        }
    });
    let d = render(spec);
    let p = pod(&d);
    assert_eq!(p.service_account_name.as_deref(), Some("orders"));
    assert_eq!(
        p.termination_grace_period_seconds,
        Some(600),
        "longer user grace kept"
    );
    let app = &p.containers[0];
    assert!(
        app.lifecycle
            .as_ref()
            .unwrap()
            .pre_stop
            .as_ref()
            .unwrap()
            .exec
            .is_some(),
        "user preStop kept"
    );
    let args = p.containers[1].args.as_ref().unwrap();
    assert_eq!(
        arg_after(args, "--metrics-addr"),
        Some("0.0.0.0:9091"),
        "9090 taken by the user"
    );
    let meta = &d.spec.template.metadata.as_ref().unwrap();
    assert_eq!(
        meta.labels
            .as_ref()
            .unwrap()
            .get("team")
            .map(String::as_str),
        Some("shop")
    );
    assert_eq!(
        meta.annotations
            .as_ref()
            .unwrap()
            .get("a")
            .map(String::as_str),
        Some("b")
    );
}

#[test]
fn metrics_port_avoids_the_http_handler() {
    let mut spec = http_spec();
    spec["handler"] = json!({"http": {"port": 9090}});
    let d = render(spec);
    let args = pod(&d).containers[1].args.as_ref().unwrap();
    assert_eq!(arg_after(args, "--metrics-addr"), Some("0.0.0.0:9091"));
    assert_eq!(
        arg_after(args, "--http-url"),
        Some("http://127.0.0.1:9090/messages")
    );
}

#[test]
fn redis_url_comes_from_the_secret() {
    let mut spec = http_spec();
    spec["idempotency"] =
        json!({"store": "redis", "redis": {"urlSecretRef": {"name": "redis", "key": "url"}}});
    let d = render(spec);
    let w = &pod(&d).containers[1];
    let e = w
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "QC_REDIS_URL")
        .unwrap();
    let sk = e
        .value_from
        .as_ref()
        .unwrap()
        .secret_key_ref
        .as_ref()
        .unwrap();
    assert_eq!((sk.name.as_str(), sk.key.as_str()), ("redis", "url"));
    assert!(
        !w.args
            .as_ref()
            .unwrap()
            .iter()
            .any(|a| a.contains("redis://"))
    );
}

#[test]
fn no_region_without_one_in_spec_or_url() {
    let mut spec = http_spec();
    spec["queue"] = json!({"url": "http://127.0.0.1:5000/123456789012/orders"});
    let d = render(spec);
    let w = &pod(&d).containers[1];
    assert_eq!(arg_after(w.args.as_ref().unwrap(), "--region"), None);
    assert_eq!(env_value(w, "AWS_REGION"), None);
}

#[test]
fn region_from_the_queue_url_as_the_worker_resolves_it() {
    for (url, region) in crate::aws::facts::REGION_CASES {
        let mut spec = http_spec();
        spec["queue"] = json!({ "url": url });
        let w = worker_args(
            &qc(spec).spec,
            "default",
            None,
            9090,
            &WorkerLaunch::Http {
                url: "http://127.0.0.1:8080/".into(),
            },
        );
        assert_eq!(arg_after(&w, "--region"), *region, "{url}");
    }
}

#[test]
fn render_is_deterministic() {
    assert_eq!(render(exec_spec()), render(exec_spec()));
}

#[test]
fn plan_without_uid_has_no_owner() {
    let mut q = qc(http_spec());
    q.metadata.uid = None;
    let d = deployment(&q, &RenderOptions::default()).unwrap();
    assert!(d.metadata.owner_references.is_none());
    assert_eq!(
        pod(&d).containers[1].image.as_deref(),
        Some(default_worker_image().as_str())
    );
}

#[test]
fn bad_templates_name_the_field() {
    let cases: [(&str, Value, &str); 8] = [
        (
            "no containers",
            json!({"spec": {"containers": []}}),
            "spec.template.spec.containers is empty",
        ),
        (
            "no pod spec",
            json!({}),
            "spec.template.spec.containers is empty",
        ),
        (
            "reserved container name",
            json!({"spec": {"containers": [{"name": "a"}, {"name": "qc-worker"}]}}),
            "spec.template.spec.containers[1].name \"qc-worker\"",
        ),
        (
            "reserved init container name",
            json!({"spec": {"containers": [{"name": "a"}], "initContainers": [{"name": "qc-worker-install"}]}}),
            "spec.template.spec.initContainers[0].name",
        ),
        (
            "reserved volume",
            json!({"spec": {"containers": [{"name": "a"}], "volumes": [{"name": "qc-worker-bin", "emptyDir": {}}]}}),
            "spec.template.spec.volumes[0].name",
        ),
        (
            "the rate share's volume",
            json!({"spec": {"containers": [{"name": "a"}], "volumes": [{"name": "x", "emptyDir": {}}, {"name": "qc-rate-share", "emptyDir": {}}]}}),
            "spec.template.spec.volumes[1].name \"qc-rate-share\" is reserved for the worker",
        ),
        (
            "reserved port name on a sidecar",
            json!({"spec": {"containers": [{"name": "a"}, {"name": "side", "ports": [{"containerPort": 80}, {"name": "qc-metrics", "containerPort": 9100}]}]}}),
            "spec.template.spec.containers[1].ports[1].name \"qc-metrics\" is reserved",
        ),
        (
            "the worker's volume mounted by a sidecar",
            json!({"spec": {"containers": [{"name": "a"}, {"name": "side", "volumeMounts": [{"name": "qc-worker-bin", "mountPath": "/x"}]}]}}),
            "spec.template.spec.containers[1].volumeMounts[0] mounts \"qc-worker-bin\"",
        ),
    ];
    for (name, template, needle) in cases {
        let mut spec = exec_spec();
        spec["template"] = template;
        let err = deployment(&qc(spec), &RenderOptions::default()).unwrap_err();
        assert!(err.to_string().contains(needle), "{name}: {err}");
    }
    let mut spec = http_spec();
    spec["handler"] = json!({});
    assert_eq!(
        deployment(&qc(spec), &RenderOptions::default()).unwrap_err(),
        RenderError::NoHandler
    );
}

#[test]
fn selector_string_matches_labels() {
    assert_eq!(
        selector_string("orders"),
        "app.kubernetes.io/instance=orders,app.kubernetes.io/name=qc-worker"
    );
}

#[test]
fn worker_resources_default_and_from_the_spec() {
    let q = |s: &str| Quantity(s.to_string());
    // Default: the worker container of the http layout and the install container of the exec layout.
    let d = render(http_spec());
    let worker = &pod(&d).containers[1];
    assert_eq!(worker.name, WORKER_CONTAINER);
    let r = worker.resources.as_ref().unwrap();
    assert_eq!(
        r.requests.as_ref().unwrap(),
        &BTreeMap::from([
            ("cpu".to_string(), q("50m")),
            ("memory".to_string(), q("32Mi"))
        ])
    );
    assert_eq!(
        r.limits.as_ref().unwrap(),
        &BTreeMap::from([("memory".to_string(), q("128Mi"))])
    );
    let d = render(exec_spec());
    let install = &pod(&d).init_containers.as_ref().unwrap()[0];
    assert_eq!(
        install.resources, worker.resources,
        "quota counts init containers too"
    );
    assert!(
        pod(&d).containers[0].resources.is_none(),
        "the user's container keeps its own resources"
    );

    // Set in the spec: replaces the default as a whole.
    let mut spec = http_spec();
    spec["worker"] = json!({"resources": {"requests": {"cpu": 1, "memory": "64Mi"}, "limits": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "1Gi"}}});
    let d = render(spec);
    let r = pod(&d).containers[1].resources.clone().unwrap();
    assert_eq!(
        r.requests.unwrap(),
        BTreeMap::from([
            ("cpu".to_string(), q("1")),
            ("memory".to_string(), q("64Mi"))
        ])
    );
    assert_eq!(
        r.limits.unwrap(),
        BTreeMap::from([
            ("cpu".to_string(), q("2")),
            ("ephemeral-storage".to_string(), q("1Gi")),
            ("memory".to_string(), q("1Gi"))
        ])
    );

    let mut spec = http_spec();
    spec["worker"] = json!({"resources": {"requests": {"cpu": "lots"}}});
    let e = deployment(&qc(spec), &RenderOptions::default()).unwrap_err();
    assert_eq!(e.reason(), "InvalidResources");
    assert!(
        e.to_string()
            .contains("spec.worker.resources.requests.cpu \"lots\""),
        "{e}"
    );
}

#[test]
fn quantities_follow_the_kubernetes_grammar() {
    for ok in [
        "50m", "0.5", ".5", "1", "+1", "128Mi", "1Gi", "1e3", "1E-2", "2k", "1.5G",
    ] {
        assert!(crate::api::is_quantity(ok), "{ok}");
    }
    for bad in [
        "", "m", "1.2.3", "128MB", "1 Gi", "1Gi\n", "lots", "1e", "1Mib", "--1", "0x10",
    ] {
        assert!(!crate::api::is_quantity(bad), "{bad}");
    }
}

#[test]
fn exec_container_gets_the_restricted_fields_it_leaves_unset() {
    let d = render(exec_spec());
    let p = pod(&d);
    let sc = p.containers[0].security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    // Not asked by the restricted standard: left to the user.
    assert_eq!(sc.read_only_root_filesystem, None);
    assert_eq!(sc.run_as_user, None);
    assert!(
        p.containers[1].security_context.is_none(),
        "sidecars are the user's"
    );

    // What the user sets wins, in the container or in the pod.
    let mut spec = exec_spec();
    spec["template"]["spec"]["containers"][0]["securityContext"] = json!({
        "allowPrivilegeEscalation": true,
        "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["NET_RAW"]},
        "readOnlyRootFilesystem": true
    });
    spec["template"]["spec"]["securityContext"] = json!({
        "runAsNonRoot": false,
        "seccompProfile": {"type": "Localhost", "localhostProfile": "p.json"}
    });
    let d = render(spec);
    let sc = pod(&d).containers[0].security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(true));
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["NET_RAW".to_string()]));
    assert_eq!(caps.add, Some(vec!["NET_BIND_SERVICE".to_string()]));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.run_as_non_root, None, "the pod's false stands");
    assert_eq!(sc.seccomp_profile, None, "the pod's profile stands");

    // A privileged container or root user: nothing the API server would reject or the image cannot run.
    let mut spec = exec_spec();
    spec["template"]["spec"]["containers"][0]["securityContext"] =
        json!({"privileged": true, "runAsUser": 0});
    let d = render(spec);
    let sc = pod(&d).containers[0].security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, None);
    assert_eq!(sc.run_as_non_root, None);
    assert_eq!(sc.privileged, Some(true));
}

/// qc-worker never calls the Kubernetes API: the pod gets no API token unless the user's template asks
/// for one, in either layout. The service account stays the template's (one of the pod's namespace).
#[test]
fn the_pod_mounts_no_api_token_unless_the_template_asks() {
    for layout in [http_spec(), exec_spec()] {
        let d = render(layout.clone());
        let p = pod(&d);
        assert_eq!(p.automount_service_account_token, Some(false));
        assert_eq!(p.service_account_name, None);
        for asked in [true, false] {
            let mut spec = layout.clone();
            spec["template"]["spec"]["automountServiceAccountToken"] = json!(asked);
            spec["template"]["spec"]["serviceAccountName"] = json!("orders");
            let d = render(spec);
            let p = pod(&d);
            assert_eq!(p.automount_service_account_token, Some(asked));
            assert_eq!(p.service_account_name.as_deref(), Some("orders"));
        }
    }
}

/// The worker assumes the QueueConsumer's role as the controller does (same session and ExternalId),
/// in both layouts; without a role it gets no role flag.
#[test]
fn the_worker_assumes_the_consumers_role_in_both_layouts() {
    for layout in [http_spec(), exec_spec()] {
        let d = render(layout.clone());
        let args = worker_command_line(&d);
        assert!(!args.iter().any(|a| a.starts_with("--role")), "{args:?}");
        let mut spec = layout.clone();
        spec["aws"] = json!({"roleArn": "arn:aws:iam::123456789012:role/qc-shop-orders"});
        let d = render(spec);
        let args = worker_command_line(&d);
        assert_eq!(
            arg_after(&args, "--role-arn"),
            Some("arn:aws:iam::123456789012:role/qc-shop-orders"),
            "{args:?}"
        );
        assert_eq!(
            arg_after(&args, "--role-session-name"),
            Some("qc-shop.orders")
        );
        assert_eq!(arg_after(&args, "--role-external-id"), Some("qc:shop"));
        // Flags before the exec layout's `--`, where they are still qc-worker's.
        let dashdash = args.iter().position(|a| a == "--").unwrap_or(args.len());
        let at = args.iter().position(|a| a == "--role-arn").unwrap();
        assert!(at < dashdash, "{args:?}");
    }
}

/// The downward-API volume of the rate share and the mount in the container that runs the worker.
fn rate_volume_and_mount(d: &Deployment, container: &str) -> (Volume, VolumeMount) {
    let p = pod(d);
    let v = p
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == RATE_VOLUME)
        .cloned()
        .expect("the rate volume");
    let c = p.containers.iter().find(|c| c.name == container).unwrap();
    let m = c
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == RATE_VOLUME)
        .cloned()
        .expect("the rate mount");
    (v, m)
}

#[test]
fn max_rate_renders_the_share_flags_and_the_annotation_file() {
    for (mut spec, container) in [(http_spec(), "qc-worker"), (exec_spec(), "app")] {
        spec["processing"]["maxRate"] = json!(20);
        spec["scaling"] = json!({"maxReplicas": 3});
        let d = render(spec);
        let args = worker_command_line(&d);
        // Until annotated: maxRate / maxReplicas, rounded down to the thousandth.
        assert_eq!(arg_after(&args, "--max-rate"), Some("6.666"), "{container}");
        assert_eq!(
            arg_after(&args, "--max-rate-file"),
            Some("/etc/qc/rate/share")
        );
        let (v, m) = rate_volume_and_mount(&d, container);
        let items = v.downward_api.unwrap().items.unwrap();
        assert_eq!(items.len(), 1);
        assert_eq!(items[0].path, "share");
        assert_eq!(
            items[0].field_ref.as_ref().unwrap().field_path,
            "metadata.annotations['sqs.consumers.dev/rate-share']"
        );
        assert_eq!(m.mount_path, "/etc/qc/rate");
        assert_eq!(m.read_only, Some(true));
        // Only the worker's container reads it.
        let others = pod(&d)
            .containers
            .iter()
            .filter(|c| c.name != container)
            .filter(|c| {
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == RATE_VOLUME)
            })
            .count();
        assert_eq!(others, 0);
    }
}

#[test]
fn without_max_rate_no_share_flag_nor_volume() {
    let d = render(http_spec());
    let args = worker_command_line(&d);
    assert!(
        !args.iter().any(|a| a.starts_with("--max-rate")),
        "{args:?}"
    );
    assert!(
        !pod(&d)
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == RATE_VOLUME)
    );
}

/// #48: `handler.schema` mounts its ConfigMap key read-only into the container that runs the worker
/// (no other), not optional, and passes the file with `--schema-file`.
#[test]
fn schema_renders_the_config_map_mount_and_the_flag() {
    for (mut spec, container) in [(http_spec(), "qc-worker"), (exec_spec(), "app")] {
        spec["handler"]["schema"] =
            json!({"configMapKeyRef": {"name": "order-schema", "key": "order.json"}});
        let d = render(spec);
        let args = worker_command_line(&d);
        assert_eq!(
            arg_after(&args, "--schema-file"),
            Some(SCHEMA_FILE),
            "{container}"
        );
        let p = pod(&d);
        let v = p
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == SCHEMA_VOLUME)
            .expect("the schema volume");
        let cm = v.config_map.as_ref().unwrap();
        assert_eq!(cm.name, "order-schema");
        assert_eq!(cm.optional, Some(false));
        let items = cm.items.as_ref().unwrap();
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("order.json", "schema.json")
        );
        let mounted: Vec<&str> = p
            .containers
            .iter()
            .filter(|c| {
                c.volume_mounts.iter().flatten().any(|m| {
                    m.name == SCHEMA_VOLUME
                        && m.read_only == Some(true)
                        && m.mount_path == SCHEMA_MOUNT
                })
            })
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(mounted, [container]);
    }
    let d = render(http_spec());
    assert!(!worker_command_line(&d).iter().any(|a| a == "--schema-file"));
    assert!(
        !pod(&d)
            .volumes
            .iter()
            .flatten()
            .any(|v| v.name == SCHEMA_VOLUME)
    );
}

/// #48: each `spec.filter.patterns` entry becomes one `--filter`, in order, as written.
#[test]
fn filter_patterns_render_one_flag_each() {
    let mut spec = http_spec();
    spec["filter"] = json!({"patterns": [r#"{"body": {"type": ["order"]}}"#, r#"{"attributes": {"MessageGroupId": [{"exists": true}]}}"#]});
    let args = worker_command_line(&render(spec));
    let got: Vec<&str> = args
        .windows(2)
        .filter(|w| w[0] == "--filter")
        .map(|w| w[1].as_str())
        .collect();
    assert_eq!(
        got,
        [
            r#"{"body": {"type": ["order"]}}"#,
            r#"{"attributes": {"MessageGroupId": [{"exists": true}]}}"#
        ]
    );
    assert!(
        !worker_command_line(&render(http_spec()))
            .iter()
            .any(|a| a == "--filter")
    );
}

/// #48: the DynamoDB store renders its table and attribute names; nothing for the other stores.
#[test]
fn dynamodb_store_renders_its_table_flags() {
    let mut spec = http_spec();
    spec["idempotency"] = json!({"store": "dynamodb", "dynamodb": {"table": "orders-idempotency"}});
    let args = worker_command_line(&render(spec));
    assert_eq!(arg_after(&args, "--idempotency-store"), Some("dynamodb"));
    assert_eq!(
        arg_after(&args, "--dynamodb-table"),
        Some("orders-idempotency")
    );
    assert_eq!(arg_after(&args, "--dynamodb-key-attribute"), Some("id"));
    assert_eq!(
        arg_after(&args, "--dynamodb-ttl-attribute"),
        Some("expiresAt")
    );
    assert!(
        !worker_command_line(&render(http_spec()))
            .iter()
            .any(|a| a.starts_with("--dynamodb"))
    );
}

/// The worker container's environment (http layout).
fn worker_env_of(d: &Deployment) -> Container {
    pod(d)
        .containers
        .iter()
        .find(|c| c.name == "qc-worker")
        .cloned()
        .unwrap()
}

fn render_with(spec: Value, tracing: TracingDefaults) -> Result<Deployment, RenderError> {
    deployment(
        &qc(spec),
        &RenderOptions {
            worker_image: "qc:test".into(),
            tracing,
        },
    )
}

#[test]
fn tracing_is_off_unless_the_spec_or_the_operator_turns_it_on() {
    let with = |tracing: Value| {
        let mut s = http_spec();
        s["worker"] = json!({"tracing": tracing});
        s
    };
    let on = TracingDefaults {
        enabled: true,
        endpoint: Some("http://collector.observability:4318".into()),
        sampling: "1%".into(),
    };
    // Off: no OTLP variable at all (the worker then builds no span).
    let d = render_with(http_spec(), TracingDefaults::default()).unwrap();
    let w = worker_env_of(&d);
    assert_eq!(env_value(&w, "OTEL_EXPORTER_OTLP_ENDPOINT"), None);
    // The operator's default, applied to a spec that says nothing.
    let w = worker_env_of(&render_with(http_spec(), on.clone()).unwrap());
    assert_eq!(
        env_value(&w, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        Some("http://collector.observability:4318")
    );
    assert_eq!(
        env_value(&w, "OTEL_TRACES_SAMPLER"),
        Some("parentbased_traceidratio")
    );
    assert_eq!(env_value(&w, "OTEL_TRACES_SAMPLER_ARG"), Some("0.01"));
    assert_eq!(env_value(&w, "OTEL_SERVICE_NAME"), Some("qc-worker"));
    assert_eq!(
        env_value(&w, "OTEL_RESOURCE_ATTRIBUTES"),
        Some("k8s.namespace.name=shop,k8s.deployment.name=orders")
    );
    // The spec turns it off against the default, or on with its own endpoint and ratio.
    let d = render_with(with(json!({"enabled": false})), on.clone()).unwrap();
    assert_eq!(
        env_value(&worker_env_of(&d), "OTEL_EXPORTER_OTLP_ENDPOINT"),
        None
    );
    let d = render_with(
        with(json!({"enabled": true, "endpoint": "http://otel:4318", "sampling": "100%"})),
        TracingDefaults::default(),
    )
    .unwrap();
    let w = worker_env_of(&d);
    assert_eq!(
        env_value(&w, "OTEL_EXPORTER_OTLP_ENDPOINT"),
        Some("http://otel:4318")
    );
    assert_eq!(env_value(&w, "OTEL_TRACES_SAMPLER_ARG"), Some("1"));
    // The exec layout's worker runs in the user's container: the variables go there.
    let mut exec = exec_spec();
    exec["worker"] =
        json!({"tracing": {"enabled": true, "endpoint": "http://otel:4318", "sampling": "0.1%"}});
    let d = render_with(exec, TracingDefaults::default()).unwrap();
    assert_eq!(
        env_value(&pod(&d).containers[0], "OTEL_TRACES_SAMPLER_ARG"),
        Some("0.001")
    );
}

#[test]
fn tracing_without_an_endpoint_or_with_a_bad_percentage_names_the_field_and_the_fix() {
    let with = |tracing: Value| {
        let mut s = http_spec();
        s["worker"] = json!({"tracing": tracing});
        s
    };
    let err = render_with(with(json!({"enabled": true})), TracingDefaults::default()).unwrap_err();
    assert_eq!(err, RenderError::TracingWithoutEndpoint);
    assert_eq!(err.reason(), "InvalidTracing");
    assert!(
        err.to_string().contains("spec.worker.tracing.endpoint")
            && err.to_string().contains("tracing.otlp.endpoint"),
        "{err}"
    );
    let err = render_with(
        with(json!({"enabled": true, "endpoint": "http://otel:4318", "sampling": "5"})),
        TracingDefaults::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.worker.tracing.sampling: \"5\" is not a percentage"),
        "{err}"
    );
    let err = render_with(
        with(json!({"enabled": true, "endpoint": "https://otel:4318"})),
        TracingDefaults::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("spec.worker.tracing.endpoint"),
        "{err}"
    );
}
