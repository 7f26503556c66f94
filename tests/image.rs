//! The image layer: the product image that `scripts/image` builds, run with podman, and the worker
//! Deployments that `qc-operator plan` renders for the samples, run as pods with `podman kube play` against
//! moto, with a handler image that holds one static binary (tests/image/handler.rs) and nothing else (no CA
//! roots).
//!
//! `scripts/test` builds the images (scripts/lib.sh `prepare_image_tests`: a debug static musl build) and
//! exports QC_TEST_IMAGE and QC_TEST_HANDLER_IMAGE. Without them a test skips and says so loudly, unless
//! `QC_REQUIRE_PODMAN=1` (set by `scripts/test` when podman works): then it fails.
//!
//! What the pods run is the rendered Deployment with a test overlay, each change named where it is made:
//! podman is not a kubelet (docs/image.md, "Running the worker pod with podman").

mod common;

use common::node::{counts, send};

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};

struct Images {
    product: String,
    handler: String,
}

/// The images scripts/test built, or None after a loud skip message (a failure when podman is required).
fn images(test: &str) -> Option<Images> {
    let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let (Some(product), Some(handler)) = (get("QC_TEST_IMAGE"), get("QC_TEST_HANDLER_IMAGE")) {
        return Some(Images { product, handler });
    }
    assert!(
        std::env::var("QC_REQUIRE_PODMAN").as_deref() != Ok("1"),
        "{test}: QC_REQUIRE_PODMAN=1 but QC_TEST_IMAGE or QC_TEST_HANDLER_IMAGE is not set: \
         source scripts/lib.sh and run ensure_podman && prepare_image_tests"
    );
    eprintln!(
        "\n!!! SKIPPED {test}: no images to run (QC_TEST_IMAGE, QC_TEST_HANDLER_IMAGE unset). \
         `source scripts/lib.sh; ensure_podman && prepare_image_tests` builds them; scripts/test does \
         wherever podman works.\n"
    );
    None
}

fn podman(args: &[&str]) -> Output {
    Command::new("podman")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
}

/// podman's stdout; panics with its stderr when it fails.
fn podman_ok(args: &[&str]) -> String {
    let out = podman(args);
    assert!(
        out.status.success(),
        "podman {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// (a) Both names answer --version in a container with a read-only root, no capability at all and
/// no-new-privileges, as the image's own user; the image holds the binary (`qc-worker` a symlink to
/// `qc-operator`: one file, docs/image.md), CA roots, passwd and group, and nothing else (no shell, no C
/// library); its OCI labels say what it is.
#[test]
fn image_runs_read_only_without_capabilities_and_holds_only_its_files() {
    let Some(images) = images("image_runs_read_only_without_capabilities_and_holds_only_its_files")
    else {
        return;
    };
    let version = env!("CARGO_PKG_VERSION");
    for bin in ["qc-operator", "qc-worker"] {
        let entrypoint = format!("--entrypoint=/usr/local/bin/{bin}");
        let out = podman_ok(&[
            "run",
            "--rm",
            "--read-only",
            "--cap-drop=ALL",
            "--security-opt=no-new-privileges",
            "--network=none",
            &entrypoint,
            &images.product,
            "--version",
        ]);
        assert_eq!(out.trim(), format!("{bin} {version}"), "{bin} --version");
    }
    // The process runs as the image's numeric non-root user, with an empty capability set.
    let inspect: Value = serde_json::from_str(&podman_ok(&["image", "inspect", &images.product]))
        .expect("podman image inspect prints JSON");
    let config = &inspect[0]["Config"];
    assert_eq!(config["User"], "65532:65532");
    assert_eq!(
        config["Entrypoint"],
        json!(["/usr/local/bin/qc-operator"]),
        "{config}"
    );
    let labels = &config["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], version);
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    // The revision is this checkout's commit (the image was built from it), "-dirty" when it had changes.
    let head = Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    if let Some(head) = head {
        let revision = labels["org.opencontainers.image.revision"]
            .as_str()
            .unwrap_or("");
        assert!(
            revision == head || revision == format!("{head}-dirty"),
            "revision label {revision:?}, checkout at {head}"
        );
    }
    for label in [
        "org.opencontainers.image.source",
        "org.opencontainers.image.revision",
    ] {
        let value = labels[label].as_str().unwrap_or("");
        assert!(
            !value.is_empty() && value != "unknown",
            "{label} is {value:?}"
        );
    }

    // Every file of the image, from its exported root filesystem.
    let container = podman_ok(&["create", &images.product]).trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("root.tar");
    let export = podman(&["export", "-o", tar.to_str().unwrap(), &container]);
    podman_ok(&["rm", &container]);
    assert!(
        export.status.success(),
        "{}",
        String::from_utf8_lossy(&export.stderr)
    );
    let listing = Command::new("tar").arg("-tf").arg(&tar).output().unwrap();
    assert!(listing.status.success());
    let files: BTreeSet<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .filter(|l| !l.is_empty() && !l.ends_with('/'))
        .collect();
    // podman adds the mount points it always bind-mounts (resolv.conf, hosts, hostname, .containerenv)
    // as empty files when it creates a container: allowed, and checked to be empty below.
    let runtime: BTreeSet<&str> = [
        "etc/hostname",
        "etc/hosts",
        "etc/resolv.conf",
        "run/.containerenv",
    ]
    .into();
    let own: BTreeSet<&str> = files
        .iter()
        .map(String::as_str)
        .filter(|f| !runtime.contains(f))
        .collect();
    assert_eq!(
        own,
        [
            "etc/group",
            "etc/passwd",
            "etc/ssl/certs/ca-certificates.crt",
            "usr/local/bin/qc-operator",
            "usr/local/bin/qc-worker",
        ]
        .into(),
        "the image holds exactly the binaries, CA roots, passwd and group"
    );
    // qc-worker is the same file as qc-operator, so the image carries the code once.
    let verbose = Command::new("tar").arg("-tvf").arg(&tar).output().unwrap();
    let verbose = String::from_utf8_lossy(&verbose.stdout);
    let worker = verbose
        .lines()
        .find(|l| l.contains("usr/local/bin/qc-worker"))
        .expect("qc-worker in the image");
    assert!(
        worker.starts_with('l') && worker.ends_with("usr/local/bin/qc-worker -> qc-operator"),
        "{worker}"
    );
}

/// What the overlay changes for podman, and where the pod's handler writes what it saw.
struct PodRun {
    /// The overlaid Deployment as `podman kube play` reads it.
    file: PathBuf,
    /// Every message id the handler recorded, one a line (a host directory mounted into the pod).
    seen: PathBuf,
    metrics_port: u16,
    /// The container that runs qc-worker (the sidecar, or the user's container in the exec layout).
    worker_container: String,
    /// Its rendered securityContext.
    worker_security: Value,
    /// The rendered terminationGracePeriodSeconds.
    grace_seconds: i64,
    _dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

fn unique_suffix() -> String {
    common::unique_name("img").replace("img-", "")
}

/// `qc-operator plan` of `sample` after `edit` (the user's side: queue, images, names), its Deployment
/// overlaid for podman (the test's side). `handler` indexes the container that runs the user's handler.
fn pod_for_sample(
    sample: &str,
    images: &Images,
    edit: impl FnOnce(&mut Value),
    namespace: &str,
) -> (PodRun, Value) {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(sample))
        .unwrap_or_else(|e| panic!("{sample}: {e}"));
    let mut qc: Value = serde_saphyr::from_str(&text).unwrap();
    edit(&mut qc);
    let qc_file = dir.path().join("qc.yaml");
    std::fs::write(&qc_file, serde_json::to_string_pretty(&qc).unwrap()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .arg("plan")
        .arg(&qc_file)
        .args(["--worker-image", &images.product])
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).unwrap_or_default();
    let mut deployment = docs
        .into_iter()
        .find(|d| d["kind"] == "Deployment")
        .unwrap_or_else(|| {
            panic!(
                "plan {sample} printed no Deployment: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });

    let seen_dir = dir.path().join("seen");
    std::fs::create_dir(&seen_dir).unwrap();
    // The handler runs as the image's uid 65532: the host directory must be writable by it.
    std::fs::set_permissions(
        &seen_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let metrics_port = free_port();
    let pod = &deployment["spec"]["template"]["spec"];
    let grace_seconds = pod["terminationGracePeriodSeconds"]
        .as_i64()
        .expect("render sets terminationGracePeriodSeconds");
    let worker = pod["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["command"][0]
                .as_str()
                .is_some_and(|p| p.ends_with("/qc-worker"))
        })
        .expect("a container runs qc-worker");
    let worker_container = worker["name"].as_str().unwrap().to_string();
    let worker_security = worker["securityContext"].clone();
    overlay(&mut deployment, namespace, metrics_port, &seen_dir);
    let file = dir.path().join("deployment.yaml");
    // JSON is YAML: podman reads it as it is.
    std::fs::write(&file, serde_json::to_string_pretty(&deployment).unwrap()).unwrap();
    (
        PodRun {
            file,
            seen: seen_dir.join("ids"),
            metrics_port,
            worker_container,
            worker_security,
            grace_seconds,
            _dir: dir,
        },
        deployment,
    )
}

/// The test overlay: what podman 4.3's `kube play` needs to run the rendered Deployment on one machine.
fn overlay(deployment: &mut Value, namespace: &str, metrics_port: u16, seen_dir: &Path) {
    let pod = &mut deployment["spec"]["template"]["spec"];
    let has_init = pod["initContainers"]
        .as_array()
        .is_some_and(|c| !c.is_empty());
    if has_init {
        // podman restarts init containers forever under restartPolicy Always (a kubelet runs them once).
        pod["restartPolicy"] = json!("OnFailure");
    }
    // Host networking, so the pod reaches moto on the host's loopback; podman then refuses `ports`.
    pod["hostNetwork"] = json!(true);
    // emptyDir volumes become podman named volumes, shared by every pod with that volume name on the
    // machine: a name of this run's own.
    let suffix = unique_suffix();
    let mut renamed = Vec::new();
    for v in pod["volumes"].as_array_mut().into_iter().flatten() {
        let old = v["name"].as_str().unwrap_or("").to_string();
        let new = format!("{old}-{suffix}");
        v["name"] = json!(new);
        renamed.push((old, new));
    }
    for list in ["containers", "initContainers"] {
        for c in pod[list].as_array_mut().into_iter().flatten() {
            let c = c.as_object_mut().unwrap();
            c.remove("ports");
            for m in c
                .get_mut("volumeMounts")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some((_, new)) = renamed.iter().find(|(old, _)| m["name"] == old.as_str()) {
                    m["name"] = json!(new);
                }
            }
            for e in c
                .get_mut("env")
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                // podman does not resolve fieldRef metadata.namespace: the namespace as a value.
                if e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace" {
                    let name = e["name"].clone();
                    *e = json!({"name": name, "value": namespace});
                }
            }
            let runs_worker = c
                .get("command")
                .and_then(Value::as_array)
                .and_then(|cmd| cmd.first())
                .and_then(Value::as_str)
                .is_some_and(|p| p.ends_with("/qc-worker"))
                && !c
                    .get("command")
                    .and_then(Value::as_array)
                    .is_some_and(|cmd| cmd.iter().any(|a| a == "--copy-self-to"));
            if runs_worker {
                // On the host's network the worker's port must be one no other process holds.
                for a in c
                    .get_mut("args")
                    .and_then(Value::as_array_mut)
                    .into_iter()
                    .flatten()
                {
                    if a == "0.0.0.0:9090" {
                        *a = json!(format!("127.0.0.1:{metrics_port}"));
                    }
                }
                for probe in ["livenessProbe", "readinessProbe"] {
                    if let Some(p) = c.get_mut(probe) {
                        assert_eq!(p["httpGet"]["port"], 9090, "{probe}");
                        p["httpGet"]["port"] = json!(metrics_port);
                    }
                }
                // moto's dummy keys; in a cluster the worker's credentials come from IRSA or Pod Identity.
                let env = c.entry("env").or_insert_with(|| json!([]));
                let env = env.as_array_mut().unwrap();
                env.push(json!({"name": "AWS_ACCESS_KEY_ID", "value": "testing"}));
                env.push(json!({"name": "AWS_SECRET_ACCESS_KEY", "value": "testing"}));
            }
        }
    }
    // A host directory where the handler records each message id it saw.
    let seen = json!({"name": "seen", "hostPath": {"path": seen_dir, "type": "Directory"}});
    match pod["volumes"].as_array_mut() {
        Some(volumes) => volumes.push(seen),
        None => pod["volumes"] = json!([seen]),
    }
    let handler = &mut pod["containers"][0];
    let mounts = handler
        .as_object_mut()
        .unwrap()
        .entry("volumeMounts")
        .or_insert_with(|| json!([]));
    mounts
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "seen", "mountPath": "/seen"}));
}

/// A source queue with a DLQ (maxReceiveCount 3) on moto: (source URL, DLQ URL).
async fn queues(sqs: &aws_sdk_sqs::Client, prefix: &str) -> (String, String) {
    let dlq = common::create_queue(sqs, &common::unique_name(&format!("{prefix}-dlq")), &[]).await;
    let dlq_arn = common::queue_arn(sqs, &dlq).await;
    let url = common::create_queue(
        sqs,
        &common::unique_name(prefix),
        &[
            (QueueAttributeName::VisibilityTimeout, "120".to_string()),
            (
                QueueAttributeName::RedrivePolicy,
                json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 3}).to_string(),
            ),
        ],
    )
    .await;
    (url, dlq)
}

fn seen(run: &PodRun) -> Vec<String> {
    std::fs::read_to_string(&run.seen)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A GET on the worker's port: (status, body).
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

/// The value of an unlabelled sample in a text exposition.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The logs of a pod (`NAME-pod-0`) or of one of its containers (`NAME-pod-0-CONTAINER`).
fn logs(name: &str) -> String {
    let out = if name.ends_with("-pod-0") {
        podman(&["pod", "logs", name])
    } else {
        podman(&["logs", name])
    };
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The worker's process runs as the rendered securityContext says: its uid, no capability in effect, no
/// new privileges, and a read-only root filesystem where it asks for one (read from the kernel's view of
/// the process, /proc/PID/status, and from podman's container config).
fn assert_security_applied(run: &PodRun, pod_name: &str) {
    let sc = &run.worker_security;
    let name = format!("{pod_name}-{}", run.worker_container);
    let inspect: Value = serde_json::from_str(&podman_ok(&["inspect", &name])).unwrap();
    let container = &inspect[0];
    let pid = container["State"]["Pid"]
        .as_i64()
        .expect("a running process");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.split_whitespace().collect::<Vec<_>>())
            .unwrap_or_default()
    };
    // Without runAsUser the image's user applies: 65532 in both images here.
    let uid = sc["runAsUser"].as_i64().unwrap_or(65532).to_string();
    assert_eq!(field("Uid:"), vec![uid.as_str(); 4], "{name}: {status}");
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{name}");
    assert_eq!(field("CapPrm:"), ["0000000000000000"], "{name}");
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(field("NoNewPrivs:"), ["1"], "{name}");
    assert_eq!(
        container["HostConfig"]["ReadonlyRootfs"],
        sc["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
        "{name}"
    );
}

/// Removes the pod when the test ends, however it ends.
struct Down<'a>(&'a Path, bool);

impl Drop for Down<'_> {
    fn drop(&mut self) {
        if !self.1 {
            let _ = podman(&["kube", "down", self.0.to_str().unwrap_or_default()]);
        }
    }
}

/// Plays the pod, checks that it handles `many` messages (each seen by the handler, all deleted, DLQ
/// empty), that its probe and metrics endpoints answer, then sends slow messages and stops the pod with
/// `podman kube down` while they are in flight: it drains (nothing left hidden, each either handled or
/// back in the queue, DLQ empty). Returns the worker container's log.
async fn run_and_drain(
    run: &PodRun,
    pod_name: &str,
    url: &str,
    dlq: &str,
    many: usize,
    slow: usize,
) -> String {
    let sqs = common::sqs_client().await;
    let bodies: Vec<String> = (0..many)
        .map(|i| json!({"orderId": format!("o-{i}")}).to_string())
        .collect();
    let sent = send(&sqs, url, &bodies).await;
    assert_eq!(sent.len(), many);

    let started = Instant::now();
    let play = podman(&["kube", "play", run.file.to_str().unwrap()]);
    let mut down = Down(&run.file, false);
    assert!(
        play.status.success(),
        "podman kube play: {}{}",
        String::from_utf8_lossy(&play.stdout),
        String::from_utf8_lossy(&play.stderr)
    );

    // Every message handled and deleted.
    let deadline = Instant::now() + Duration::from_mins(3);
    loop {
        let seen: BTreeSet<String> = seen(run).into_iter().collect();
        let (visible, in_flight) = counts(&sqs, url).await;
        if seen.len() >= many && visible == 0 && in_flight == 0 {
            assert_eq!(seen, sent, "the handler saw exactly the messages sent");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 180 s the handler saw {} of {many}, queue visible {visible} in flight {in_flight}; pod logs:\n{}",
            seen.len(),
            logs(pod_name)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!(
        "{pod_name}: {many} messages handled in {:.1} s from kube play",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(counts(&sqs, dlq).await, (0, 0), "the DLQ stays empty");

    assert_security_applied(run, pod_name);

    // (d) The worker's probe and metrics endpoints answer inside the pod (its network is the host's).
    for path in ["/healthz", "/readyz"] {
        let answer = get(run.metrics_port, path);
        assert!(
            matches!(answer, Some((200, _))),
            "{path}: {answer:?}; pod logs:\n{}",
            logs(pod_name)
        );
    }
    let (status, metrics) = get(run.metrics_port, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    let deleted = sample(&metrics, "qc_worker_messages_deleted_total");
    assert!(
        deleted.is_some_and(|d| d >= many as f64),
        "qc_worker_messages_deleted_total {deleted:?} after {many} messages:\n{metrics}"
    );

    // Slow messages (the handler takes 2 s each); the pod goes down while they are in flight.
    let bodies: Vec<String> = (0..slow)
        .map(|i| json!({"orderId": format!("s-{i}"), "slow": true}).to_string())
        .collect();
    let slow_ids = send(&sqs, url, &bodies).await;
    let deadline = Instant::now() + Duration::from_mins(1);
    loop {
        let (_, metrics) = get(run.metrics_port, "/metrics").unwrap_or_default();
        if sample(&metrics, "qc_worker_in_flight").is_some_and(|n| n > 0.0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slow messages never got in flight"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // SIGTERM and the pod's grace period, as a kubelet stops a pod. podman 4.3's `kube down` alone stops
    // without any grace (measured: SIGKILL at once, 30 of 40 slow messages left hidden under their leases),
    // so the worker's container is stopped first; the handler keeps serving meanwhile (as the preStop hook
    // keeps it in a cluster), and `kube down` then removes the pod.
    let stopping = Instant::now();
    let grace = run.grace_seconds.to_string();
    let stop = podman(&[
        "stop",
        "--time",
        &grace,
        &format!("{pod_name}-{}", run.worker_container),
    ]);
    let stopped = stopping.elapsed();
    let worker_log = logs(&format!("{pod_name}-{}", run.worker_container));
    let out = podman(&["kube", "down", run.file.to_str().unwrap()]);
    down.1 = true;
    assert!(
        stop.status.success() && out.status.success(),
        "podman stop: {}; podman kube down: {}",
        String::from_utf8_lossy(&stop.stderr),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "{pod_name}: the worker drained and stopped in {:.1} s (grace {grace} s), kube down after {:.1} s",
        stopped.as_secs_f64(),
        stopping.elapsed().as_secs_f64()
    );
    // Drained: nothing left hidden under a lease; what was not handled is back in the queue.
    let (visible, in_flight) = counts(&sqs, url).await;
    assert_eq!(
        in_flight,
        0,
        "messages left in flight after the pod stopped (not released): visible {visible}; the worker's \
         last log lines:\n{}",
        worker_log
            .lines()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .join("\n")
    );
    let handled: BTreeSet<String> = seen(run)
        .into_iter()
        .filter(|id| slow_ids.contains(id))
        .collect();
    let mut back = BTreeSet::new();
    while back.len() < usize::try_from(visible).unwrap_or(usize::MAX) {
        let out = sqs
            .receive_message()
            .queue_url(url)
            .max_number_of_messages(10)
            .visibility_timeout(60)
            .send()
            .await
            .unwrap();
        let msgs = out.messages.unwrap_or_default();
        if msgs.is_empty() {
            break;
        }
        back.extend(msgs.into_iter().filter_map(|m| m.message_id));
    }
    let accounted: BTreeSet<String> = handled.union(&back).cloned().collect();
    assert_eq!(
        accounted,
        slow_ids,
        "every slow message is handled or back in the queue (handled {}, back {})",
        handled.len(),
        back.len()
    );
    assert!(
        !handled.is_empty(),
        "the in-flight slow messages were finished before the worker stopped"
    );
    assert_eq!(counts(&sqs, dlq).await, (0, 0), "the DLQ stays empty");
    worker_log
}

/// (b) + (d) The http-handler sample's Deployment as a pod: the worker sidecar POSTs each message to a
/// handler image holding one static binary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_sample_pod_handles_messages_and_drains_on_kube_down() {
    let Some(images) = images("http_sample_pod_handles_messages_and_drains_on_kube_down") else {
        return;
    };
    let sqs = common::sqs_client().await;
    let (url, dlq) = queues(&sqs, "img-http").await;
    let name = format!("orders-{}", unique_suffix());
    let handler_port = free_port();
    let handler_image = images.handler.clone();
    let (run, deployment) = pod_for_sample(
        "config/samples/sqs_v1alpha1_queueconsumer_http.yaml",
        &images,
        |qc| {
            // The user's side: this queue on moto, the handler image, a port free on this machine.
            qc["metadata"]["name"] = json!(name);
            qc["spec"]["queue"] =
                json!({"url": url, "region": "us-east-1", "endpoint": common::sqs_endpoint()});
            qc["spec"]["handler"]["http"]["port"] = json!(handler_port);
            let c = &mut qc["spec"]["template"]["spec"]["containers"][0];
            c["image"] = json!(handler_image);
            c["ports"] = json!([{"containerPort": handler_port}]);
            c["env"] = json!([{"name": "PORT", "value": handler_port.to_string()}]);
        },
        "shop",
    );
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 2, "handler and qc-worker sidecar");
    assert_eq!(containers[1]["name"], "qc-worker");
    assert_eq!(containers[1]["image"], images.product.as_str());
    run_and_drain(&run, &format!("{name}-pod-0"), &url, &dlq, 300, 40).await;
}

/// (c) + (d) The exec-layout sample's Deployment as a pod: the init container copies the static qc-worker
/// from the product image into the shared volume, with the product image's CA roots beside it, and it runs
/// inside a user image with no C library and no CA roots (the handler binary only), running the handler per
/// message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sample_pod_runs_static_worker_in_image_without_libc() {
    let Some(images) = images("exec_sample_pod_runs_static_worker_in_image_without_libc") else {
        return;
    };
    let sqs = common::sqs_client().await;
    let (url, dlq) = queues(&sqs, "img-exec").await;
    let name = format!("thumbnails-{}", unique_suffix());
    let handler_image = images.handler.clone();
    let (run, deployment) = pod_for_sample(
        "config/samples/sqs_v1alpha1_queueconsumer_exec.yaml",
        &images,
        |qc| {
            // The user's side: this queue on moto and an image whose /app/make-thumbnail (the sample's
            // command) is the static handler.
            qc["metadata"]["name"] = json!(name);
            qc["spec"]["queue"] =
                json!({"url": url, "region": "us-east-1", "endpoint": common::sqs_endpoint()});
            qc["spec"]["template"]["spec"]["containers"][0]["image"] = json!(handler_image);
        },
        "media",
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["initContainers"][0]["name"], "qc-worker-install");
    assert_eq!(pod["initContainers"][0]["image"], images.product.as_str());
    assert_eq!(
        pod["containers"][0]["command"],
        json!(["/qc/bin/qc-worker"])
    );
    // The user image holds the handler alone: no shell, no C library, no dynamic loader, no CA roots.
    // (Before the worker trusted the roots copied beside it, this debug qc-worker panicked at start here,
    // and a release one could not verify SQS: docs/image.md.)
    let container = podman_ok(&["create", &images.handler]).trim().to_string();
    let dir = tempfile::tempdir().unwrap();
    let tar = dir.path().join("root.tar");
    let export = podman(&["export", "-o", tar.to_str().unwrap(), &container]);
    podman_ok(&["rm", &container]);
    assert!(export.status.success());
    let listing = Command::new("tar").arg("-tf").arg(&tar).output().unwrap();
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.lines().any(|l| l.ends_with("app/make-thumbnail")),
        "{listing}"
    );
    assert!(
        !listing
            .lines()
            .any(|l| l.contains("lib/") || l.contains("bin/sh") || l.contains("ssl/")),
        "the user image has a library, a shell or CA roots:\n{listing}"
    );
    let worker_log = run_and_drain(&run, &format!("{name}-pod-0"), &url, &dlq, 300, 12).await;
    // Without roots of its own, the worker trusts the product image's, copied beside it.
    assert!(
        worker_log.contains("trusts the bundle beside qc-worker"),
        "{worker_log}"
    );
}
