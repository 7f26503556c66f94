//! `qc-operator plan`: the real binary on the samples, offline, with attribute files and live against
//! moto; its Deployment is the one reconcile applies.

mod common;

use std::process::Command;

use aws_sdk_sqs::types::QueueAttributeName;
use serde_json::{Value, json};

fn plan(args: &[&str]) -> (i32, Vec<Value>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .arg("plan")
        .args(args)
        .env("QC_WORKER_IMAGE", "qc:plan-test")
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&stdout).unwrap();
    let docs = docs.into_iter().filter(|d| !d.is_null()).collect();
    (
        out.status.code().unwrap(),
        docs,
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn condition<'a>(status_doc: &'a Value, type_: &str) -> &'a Value {
    status_doc["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap()
}

#[test]
fn samples_plan_to_a_deployment_and_a_status() {
    for sample in [
        "config/samples/sqs_v1alpha1_queueconsumer_http.yaml",
        "config/samples/sqs_v1alpha1_queueconsumer_exec.yaml",
        "config/samples/sqs_v1alpha1_queueconsumer_fifo.yaml",
    ] {
        let (code, docs, stderr) = plan(&[sample]);
        assert_eq!(code, 0, "{sample}: {stderr}");
        assert_eq!(docs.len(), 2, "{sample}");
        let d = &docs[0];
        assert_eq!(d["kind"], "Deployment", "{sample}");
        assert!(d["spec"].get("replicas").is_none());
        let pod = &d["spec"]["template"]["spec"];
        let named = |list: &str, name: &str| {
            pod[list]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["name"] == name)
                .cloned()
        };
        // HTTP handler: a worker container; exec handler: an init container that installs it.
        let worker = named("containers", "qc-worker")
            .or_else(|| named("initContainers", "qc-worker-install"));
        assert_eq!(worker.unwrap()["image"], "qc:plan-test", "{sample}");
        let s = &docs[1];
        assert_eq!(s["kind"], "QueueConsumer");
        assert_eq!(condition(s, "QueueReachable")["reason"], "QueueNotRead");
        assert_eq!(condition(s, "Ready")["status"], "False");
    }
}

#[test]
fn attribute_files_feed_the_rules_and_the_exit_code() {
    let sample = "config/samples/sqs_v1alpha1_queueconsumer_http.yaml";
    let (code, docs, _) = plan(&[sample, "--attributes", "tests/data/attributes_healthy.json"]);
    assert_eq!(code, 0);
    assert_eq!(condition(&docs[1], "QueueReachable")["status"], "True");
    assert_eq!(condition(&docs[1], "ConfigValid")["status"], "True");
    assert!(docs[1]["status"]["queue"]["visibilityTimeout"].is_string());

    let (code, docs, _) = plan(&[sample, "--attributes", "tests/data/attributes_risky.json"]);
    assert_eq!(code, 1, "an Error finding");
    assert_eq!(condition(&docs[1], "ConfigValid")["status"], "False");
    assert!(!docs[1]["status"]["findings"].as_array().unwrap().is_empty());
}

#[test]
fn bad_input_exits_2_and_names_the_problem() {
    let (code, _, stderr) = plan(&["tests/data/invalid.yaml"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("spec."), "{stderr}");
    let (code, _, stderr) = plan(&["/nonexistent.yaml"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("/nonexistent.yaml"), "{stderr}");
}

#[tokio::test]
async fn live_reads_the_queue_and_its_dead_letter_queue() {
    let sqs = common::sqs_client().await;
    let dlq = common::create_queue(&sqs, &common::unique_name("plan-dlq"), &[]).await;
    let dlq_arn = common::queue_arn(&sqs, &dlq).await;
    sqs.send_message()
        .queue_url(&dlq)
        .message_body("x")
        .send()
        .await
        .unwrap();
    let url = common::create_queue(
        &sqs,
        &common::unique_name("plan-src"),
        &[(
            QueueAttributeName::RedrivePolicy,
            json!({"deadLetterTargetArn": dlq_arn, "maxReceiveCount": 5}).to_string(),
        )],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("qc.yaml");
    std::fs::write(
        &file,
        format!(
            "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {{name: live, namespace: ns}}\n\
             spec:\n  queue: {{url: '{url}', endpoint: '{}'}}\n  processing: {{p99: 1s}}\n  handler: {{exec: {{command: [/h]}}}}\n\
             \x20 template: {{spec: {{containers: [{{name: app, image: app:1}}]}}}}\n",
            common::sqs_endpoint()
        ),
    )
    .unwrap();
    let allow = common::sqs_endpoint();
    let (code, docs, stderr) = plan(&[
        file.to_str().unwrap(),
        "--live",
        "--allowed-endpoint",
        &allow,
    ]);
    assert!(code == 0 || code == 1, "{stderr}");
    let s = &docs[1];
    assert_eq!(condition(s, "QueueReachable")["status"], "True", "{stderr}");
    let dl = condition(s, "DeadLetterQueueHealthy");
    assert_eq!(dl["reason"], "MessagesInDeadLetterQueue");
    assert!(dl["message"].as_str().unwrap().contains("1 message(s)"));
    assert_eq!(s["status"]["deadLetter"]["url"], json!(dlq));
    assert!(
        s["status"]["deadLetter"]["alarmName"]
            .as_str()
            .unwrap()
            .starts_with("qc-dlq-ns-live")
    );
}
