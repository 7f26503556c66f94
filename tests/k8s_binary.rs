//! `qc-operator run`, the binary, against the real Kubernetes API server `scripts/test` starts: over TLS
//! with a client certificate from a kubeconfig, as on a cluster.

mod common;

use common::fixture::consumer;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::k8s;
use kube::api::{Api, PostParams};
use qc::api::QueueConsumer;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

fn manifest() -> QueueConsumer {
    consumer("orders").exec("/h").alarm(false).typed()
}

/// The binary itself against a real API server over TLS with a client certificate (the kubeconfig
/// way): it must connect, watch and reconcile (the reconcile then fails reading the Deployment, which
/// the CRD server does not serve). The TLS connection needs the process-wide crypto provider `run`
/// chooses (two are in the tree), or it panics.
#[tokio::test]
async fn qc_operator_run_connects_to_a_real_api_server() {
    let test = "qc_operator_run_connects_to_a_real_api_server";
    let Some(real) = k8s::connect(test).await else {
        return;
    };
    let addr = free_addr();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args([
            "run",
            "--namespace",
            &real.namespace,
            "--metrics-addr",
            &addr.to_string(),
            "--log-format",
            "text",
        ])
        .env("KUBECONFIG", &real.kubeconfig)
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let qcs: Api<QueueConsumer> = Api::namespaced(real.client.clone(), &real.namespace);
    qcs.create(&PostParams::default(), &manifest())
        .await
        .unwrap();
    let metrics = || async {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            return String::new();
        };
        let _ = s
            .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await;
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        out
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("qc-operator exited: {status}");
        }
        let m = metrics().await;
        let reconciled = m
            .lines()
            .find_map(|l| l.strip_prefix("qc_reconciles_total "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        // A reconcile counts when it starts and its duration when it ends.
        let timed = m
            .lines()
            .find_map(|l| l.strip_prefix("qc_reconcile_duration_seconds_count "))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap_or(0);
        // The watch is counted when its answer begins, which may come after the first reconcile: the
        // reflector lists, the reconcile runs on what the list found, and only then does the watch start.
        let watching = m
            .lines()
            .any(|l| l.starts_with("qc_kube_requests_total{method=\"WATCH\",code=\"200\"}"));
        if reconciled >= 1 && timed >= 1 && watching {
            // The controller reports on itself: its API requests by method and answer (the watch among
            // them), how long its reconciles took, its work queue, its build and its process.
            let count = |prefix: &str| {
                m.lines()
                    .filter(|l| l.starts_with(prefix))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum::<f64>()
            };
            assert!(
                count("qc_kube_requests_total{method=\"WATCH\",code=\"200\"}") >= 1.0,
                "{m}"
            );
            assert!(
                count("qc_kube_requests_total{method=\"GET\",code=\"200\"}") >= 1.0,
                "{m}"
            );
            for family in [
                "qc_reconciles_waiting ",
                "qc_reconciles_running ",
                "qc_build_info{version=",
                "process_resident_memory_bytes ",
                "process_cpu_seconds_total ",
            ] {
                assert!(m.contains(family), "{family} missing: {m}");
            }
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no reconcile through the watch: {m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().await.unwrap();
}
