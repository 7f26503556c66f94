//! The `qc-worker` command line (docs/worker.md, "Command line"), rendered from a spec.
//! Every setting is spelled out, so `kubectl describe pod` shows what the worker runs with.

use crate::api::QueueConsumerSpec;
use crate::aws::facts::queue_region;
use crate::aws::identity::Role;

use super::shutdown_timeout;

/// How the worker reaches the handler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerLaunch {
    /// Sidecar layout: POST each message to the user's container over loopback.
    Http { url: String },
    /// Wrapper layout: run the user's command per message.
    Exec { command: Vec<String> },
}

/// The region of the spec, else the one in the queue URL; None lets the SDK's environment decide.
pub fn region(spec: &QueueConsumerSpec) -> Option<String> {
    queue_region(spec.queue.region.as_deref(), &spec.queue.url)
}

/// Arguments after the `qc-worker` executable.
pub fn worker_args(
    spec: &QueueConsumerSpec,
    namespace: &str,
    role: Option<&Role>,
    metrics_port: u16,
    launch: &WorkerLaunch,
) -> Vec<String> {
    let p = &spec.processing;
    let i = &spec.idempotency;
    let mut args: Vec<String> = vec!["--queue-url".into(), spec.queue.url.clone()];
    if let Some(region) = region(spec) {
        args.extend(["--region".into(), region]);
    }
    if let Some(endpoint) = &spec.queue.endpoint {
        args.extend(["--endpoint-url".into(), endpoint.clone()]);
    }
    // The same role, session and ExternalId as the controller's calls for this QueueConsumer; the pod
    // assumes it with its own service account's identity.
    if let Some(r) = role {
        args.extend([
            "--role-arn".into(),
            r.arn.clone(),
            "--role-session-name".into(),
            r.session_name.clone(),
            "--role-external-id".into(),
            r.external_id.clone(),
        ]);
    }
    let b = &p.breaker;
    let pairs: [(&str, String); 20] = [
        ("--concurrency", p.concurrency.to_string()),
        ("--batch-size", p.batch_size.to_string()),
        ("--wait-time", p.wait_time.to_string()),
        ("--timeout", p.timeout.to_string()),
        ("--heartbeat", p.heartbeat.enabled.to_string()),
        ("--heartbeat-interval", p.heartbeat.interval.to_string()),
        ("--retry-base", p.retry_backoff.base.to_string()),
        ("--retry-max", p.retry_backoff.max.to_string()),
        ("--on-poison", p.on_poison.as_str().to_string()),
        ("--unwrap-sns", spec.handler.unwrap_sns.as_str().to_string()),
        ("--breaker", b.enabled.to_string()),
        ("--breaker-failure-percent", b.failure_percent.to_string()),
        ("--breaker-window", b.window.to_string()),
        ("--breaker-consecutive", b.consecutive_failures.to_string()),
        ("--breaker-probe-base", b.probe_backoff.base.to_string()),
        ("--breaker-probe-max", b.probe_backoff.max.to_string()),
        ("--idempotency-store", i.store.as_str().to_string()),
        ("--idempotency-key", i.key.to_string()),
        ("--idempotency-ttl", i.ttl.to_string()),
        ("--metrics-addr", format!("0.0.0.0:{metrics_port}")),
    ];
    for (flag, value) in pairs {
        args.extend([flag.to_string(), value]);
    }
    if let Some(s3) = spec.handler.s3_payloads.as_ref().filter(|s| s.enabled) {
        args.push("--s3-payloads".into());
        // The namespace filled in here: the worker checks the names it is given, and the tenancy
        // policy checked the same ones.
        for b in &s3.buckets {
            args.extend([
                "--s3-bucket".into(),
                b.replace(crate::tenancy::NAMESPACE_PLACEHOLDER, namespace),
            ]);
        }
        // Refused beside unwrapSns (finding S3PayloadDeleteWithSns): the objects are kept rather
        // than a worker that will not start.
        if s3.delete_after_processing && spec.handler.unwrap_sns == crate::api::UnwrapSns::Off {
            args.push("--s3-delete-after".into());
        }
    }
    if let Some(d) = i
        .dynamodb
        .as_ref()
        .filter(|_| i.store == crate::api::IdempotencyStore::DynamoDb)
    {
        args.extend([
            "--dynamodb-table".into(),
            d.table.clone(),
            "--dynamodb-key-attribute".into(),
            d.key_attribute.clone(),
            "--dynamodb-ttl-attribute".into(),
            d.ttl_attribute.clone(),
        ]);
    }
    for pattern in spec.filter.iter().flat_map(|f| &f.patterns) {
        args.extend(["--filter".into(), pattern.clone()]);
    }
    if spec.handler.schema.is_some() {
        args.extend(["--schema-file".into(), super::SCHEMA_FILE.into()]);
    }
    if spec
        .handler
        .exec
        .as_ref()
        .is_some_and(|e| e.pass_aws_credentials)
    {
        args.push("--exec-pass-aws-credentials".into());
    }
    if let Some(b) = &spec.handler.batch {
        args.extend([
            "--batch-max-items".into(),
            b.max_items.to_string(),
            "--batch-max-wait".into(),
            b.max_wait.to_string(),
        ]);
    }
    // maxRate: until the controller has annotated the pod with its share, a pod paces itself to
    // maxRate / maxReplicas, a share that can never add up to more than maxRate; the annotation's
    // file then gives maxRate / replicas without a restart.
    if let Some(max_rate) = p.max_rate {
        let floor = crate::scaling::rate::share(max_rate, spec.scaling.max_replicas);
        args.extend([
            "--max-rate".into(),
            crate::scaling::rate::share_text(floor),
            "--max-rate-file".into(),
            super::RATE_SHARE_FILE.into(),
        ]);
    }
    // Unset means held up to SQS's 12 hours: the worker's own default, so no flag.
    if let Some(tolerance) = p.outage_tolerance {
        args.extend(["--outage-tolerance".into(), tolerance.to_string()]);
    }
    args.extend([
        "--shutdown-timeout".into(),
        shutdown_timeout(spec).to_string(),
    ]);
    match launch {
        WorkerLaunch::Http { url } => args.extend(["--http-url".into(), url.clone()]),
        WorkerLaunch::Exec { command } => {
            args.extend(["--exec".into(), "--".into()]);
            args.extend(command.iter().cloned());
        }
    }
    args
}
