//! The consumer runtime behind `qc-worker`: receive → process → delete with heartbeats, batched deletes,
//! backoff, FIFO ordering, idempotency and a graceful drain. `run` wires the parts; each part has its module.

pub mod batcher;
pub mod breaker;
pub mod cli;
pub mod core;
pub mod dead_letter;
pub mod dispatch;
pub mod handler;
pub mod heartbeat;
pub mod held;
pub mod http1;
pub mod idempotency;
pub mod invoke;
pub mod message;
pub mod metrics;
pub mod rate;
pub mod s3;
pub mod sns;
pub mod spans;
pub mod sqs;
pub mod trace;

use std::sync::Arc;
use std::time::Duration as StdDuration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::api::{
    Duration, HeartbeatInterval, IdempotencyKey, IdempotencyStore, OnPoison, UnwrapSns,
};
use crate::telemetry::{self, TelemetryError};

use self::core::backoff;
pub use self::core::plan::{
    PREFETCH_ROUND_TRIP_CEILING, PREFETCH_ROUND_TRIP_SHARE, batch_prefetch_calls, early_receive,
    early_receive_max, prefetch, prefetch_pays,
};
use handler::{ExecHandler, Handler, HandlerError, HttpHandler, QueueContext};
use idempotency::{DynamoStore, IdempotencyError, MemoryStore, RedisStore, Store};
use message::Processor;
use metrics::{Metrics, Readiness};
use sqs::{QueueInfo, Sqs};

/// Deletes and releases wait at most this long for a batch of 10 to fill.
pub const FLUSH_INTERVAL: StdDuration = StdDuration::from_millis(20);
/// Messages one worker handles at once, at most (`--concurrency`): the bound of the spec's
/// `processing.concurrency`, so a spec the API server admits never makes a worker that refuses to start.
pub use crate::api::MAX_CONCURRENCY;
/// Bounds of `--max-request-head`: below 1 KiB the fixed CloudEvents headers may not fit.
pub const MIN_REQUEST_HEAD: usize = 1024;
pub const MAX_REQUEST_HEAD: usize = 1024 * 1024;
/// Most messages in one batch handler call (`--batch-max-items`, `handler.batch.maxItems`).
pub const MAX_BATCH_ITEMS: u32 = crate::api::MAX_BATCH_ITEMS;
/// Keys the memory store keeps at most.
pub const MEMORY_STORE_CAPACITY: usize = 100_000;

/// Why the worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid {flag}: {reason}")]
    ValidateFlags { flag: &'static str, reason: String },
    #[error("cannot set up the SQS client: {reason}")]
    SetUpSqs { reason: String },
    #[error(transparent)]
    StartTelemetry(#[from] TelemetryError),
    #[error(transparent)]
    SetUpHandler(#[from] HandlerError),
    #[error(transparent)]
    ConnectStore(#[from] IdempotencyError),
    #[error("cannot use --schema-file {path}: {reason}")]
    LoadSchema { path: String, reason: String },
    #[error("cannot start tracing: {0}")]
    StartTracing(#[from] crate::telemetry::otlp::OtlpError),
}

/// The handler the worker calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandlerConfig {
    Http { url: String },
    Exec { command: Vec<String> },
}

/// Everything on the command line (docs/worker.md, "Command line"), already parsed.
#[derive(Clone, Debug)]
pub struct Config {
    pub queue_url: String,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    /// The role every SQS call is made as (`--role-arn`), assumed with the pod's own credentials.
    pub role: Option<crate::aws::identity::Role>,
    pub concurrency: u32,
    pub batch_size: u32,
    pub wait_time: Duration,
    pub timeout: Duration,
    pub heartbeat: bool,
    pub heartbeat_interval: HeartbeatInterval,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub on_poison: OnPoison,
    /// `--unwrap-sns`: hand the handler an SNS notification's Message and attributes.
    pub unwrap_sns: UnwrapSns,
    /// `--batch-max-items`: messages per handler call (1: one message a call, no batch mode).
    pub batch_max_items: u32,
    /// `--batch-max-wait`: how long a message waits for its batch to fill.
    pub batch_max_wait: Duration,
    /// `--exec-pass-aws-credentials`: the exec handler's processes get the static AWS keys too.
    pub exec_pass_aws_credentials: bool,
    /// `--s3-payloads` (with `--s3-delete-after`, `--s3-payload-max`): fetch the Extended Client's
    /// S3 payloads for the handler (`worker::s3`). None: off.
    pub s3_payloads: Option<s3::Settings>,
    /// `--schema-file`: a JSON Schema every body must match before a handler call (`core::schema`).
    pub schema_file: Option<std::path::PathBuf>,
    /// `--filter`: patterns in Lambda's FilterCriteria syntax (`core::filter`); none: every message
    /// is handled.
    pub filter: Vec<String>,
    pub idempotency_store: IdempotencyStore,
    pub idempotency_key: IdempotencyKey,
    pub idempotency_ttl: Duration,
    pub redis_url: Option<String>,
    /// `--dynamodb-table` and its attributes: the DynamoDB store's table.
    pub dynamodb: Option<idempotency::DynamoSettings>,
    pub metrics_addr: String,
    /// Cap of the HTTP handler's request head in bytes; attributes that do not fit are left out.
    pub max_request_head: usize,
    /// Default: `timeout` + 5s.
    pub shutdown_timeout: Option<Duration>,
    /// The outage breaker (`--breaker*`, `--outage-tolerance`); its `concurrency` is `concurrency`.
    pub breaker: breaker::Settings,
    /// `--max-rate`: messages per second this worker starts at most, until `max_rate_file` says
    /// otherwise (`worker::rate`). None: unlimited.
    pub max_rate: Option<f64>,
    /// `--max-rate-file`: where the controller's share appears (a downward-API file of a pod
    /// annotation); re-read every `rate::SHARE_POLL`.
    pub max_rate_file: Option<std::path::PathBuf>,
    pub handler: HandlerConfig,
    /// CA roots of the SQS and redis clients: the system's, else the bundle beside qc-worker
    /// ([`crate::roots`]).
    pub roots: crate::roots::Roots,
}

impl Config {
    /// Checks what the types alone cannot; the error names the flag and the fix.
    pub fn validate(&self) -> Result<(), WorkerError> {
        let bad = |flag, reason: &str| {
            Err(WorkerError::ValidateFlags {
                flag,
                reason: reason.to_string(),
            })
        };
        if self.queue_url.trim().is_empty() {
            return bad("--queue-url", "must not be empty");
        }
        if self
            .queue_url
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
        {
            return bad(
                "--queue-url",
                "must not hold spaces or control characters (CR, LF, tab); give the URL SQS printed",
            );
        }
        if let Some(r) = &self.region
            && (r.is_empty()
                || r.len() > 64
                || !r
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
        {
            return bad(
                "--region",
                "must be an AWS region name of lowercase letters, digits and dashes, e.g. us-east-1",
            );
        }
        if self.concurrency == 0 {
            return bad("--concurrency", "must be at least 1");
        }
        if self.concurrency > MAX_CONCURRENCY {
            return bad(
                "--concurrency",
                "must be at most 10000 per worker; run more replicas for more",
            );
        }
        if let Err(e) = self::core::filter::Filter::parse(&self.filter) {
            return bad("--filter", &e.to_string());
        }
        if let Some(s3) = &self.s3_payloads {
            if s3.max_bytes == 0 {
                return bad("--s3-payload-max", "must be at least 1 byte, e.g. 64MiB");
            }
            if s3.budget < 1024 {
                return bad(
                    "--s3-payload-budget",
                    "must be at least 1KiB, e.g. 64MiB (half the container's memory limit is the default)",
                );
            }
            if s3.delete_after && self.unwrap_sns != UnwrapSns::Off {
                return bad(
                    "--s3-delete-after",
                    "cannot go with --unwrap-sns on or auto: an SNS fan-out puts one S3 object behind a pointer in every subscriber's queue, and the first to finish would delete it for all; leave --s3-delete-after out and expire payloads with an S3 lifecycle rule",
                );
            }
            if s3.buckets.is_empty() {
                return bad(
                    "--s3-bucket",
                    "is required with --s3-payloads: name the buckets payloads may come from (repeat the flag, or QC_S3_BUCKETS=a,b), e.g. --s3-bucket team-a.payloads; a pointer into any other bucket is poison",
                );
            }
            if let Some(b) = s3.buckets.iter().find(|b| {
                b.is_empty()
                    || !b.bytes().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || b".-*?".contains(&c)
                    })
            }) {
                return Err(WorkerError::ValidateFlags {
                    flag: "--s3-bucket",
                    reason: format!(
                        "{b:?} is not an S3 bucket name or pattern: lowercase letters, digits, '.', '-', and '*' or '?' as wildcards"
                    ),
                });
            }
        }
        if !(1..=MAX_BATCH_ITEMS).contains(&self.batch_max_items) {
            return bad(
                "--batch-max-items",
                "must be between 1 (one message a call) and 100",
            );
        }
        if self.batch_max_wait.as_std() > StdDuration::from_mins(5) {
            return bad(
                "--batch-max-wait",
                "must be at most 5m (messages wait that long holding their leases); e.g. 1s",
            );
        }
        if !(1..=10).contains(&self.batch_size) {
            return bad(
                "--batch-size",
                "must be between 1 and 10 (SQS MaxNumberOfMessages)",
            );
        }
        if self.wait_time > Duration::from_secs(20) {
            return bad(
                "--wait-time",
                "must be at most 20s (the SQS long-poll maximum)",
            );
        }
        if self.timeout.is_zero() {
            return bad("--timeout", "must be greater than 0s");
        }
        if self.timeout > Duration::from_secs(12 * 3600) {
            return bad(
                "--timeout",
                "must be at most 12h (the SQS visibility maximum)",
            );
        }
        if self.retry_max < self.retry_base {
            return bad("--retry-max", "must not be below --retry-base");
        }
        if self.heartbeat && self.heartbeat_interval == HeartbeatInterval::Fixed(Duration::ZERO) {
            return bad(
                "--heartbeat-interval",
                "must be greater than 0s (or auto; use --heartbeat false to turn heartbeats off)",
            );
        }
        if self.idempotency_store == IdempotencyStore::Redis
            && self
                .redis_url
                .as_deref()
                .is_none_or(|u| u.trim().is_empty())
        {
            return bad(
                "--redis-url",
                "is required with --idempotency-store redis (e.g. redis://redis:6379/0)",
            );
        }
        if self.idempotency_store == IdempotencyStore::DynamoDb {
            match &self.dynamodb {
                None => {
                    return bad(
                        "--dynamodb-table",
                        "is required with --idempotency-store dynamodb (e.g. --dynamodb-table orders-idempotency)",
                    );
                }
                Some(d) if !idempotency::valid_table_name(&d.table) => {
                    return bad(
                        "--dynamodb-table",
                        "must be a DynamoDB table name: 3 to 255 letters, digits, '_', '-' or '.'",
                    );
                }
                Some(d)
                    if d.key_attribute.is_empty()
                        || d.ttl_attribute.is_empty()
                        || d.key_attribute == d.ttl_attribute =>
                {
                    return bad(
                        "--dynamodb-key-attribute",
                        "and --dynamodb-ttl-attribute must be two different non-empty attribute names (defaults: id, expiresAt)",
                    );
                }
                Some(_) => {}
            }
        }
        if !(MIN_REQUEST_HEAD..=MAX_REQUEST_HEAD).contains(&self.max_request_head) {
            return bad(
                "--max-request-head",
                "must be between 1KiB and 1MiB (the default 8KiB fits nginx's and most frameworks' limits)",
            );
        }
        let b = &self.breaker;
        if !(1..=100).contains(&b.failure_percent) {
            return bad(
                "--breaker-failure-percent",
                "must be between 1 and 100 (the default 50 opens when half the window failed)",
            );
        }
        if !(2..=1000).contains(&b.window) {
            return bad(
                "--breaker-window",
                "must be between 2 and 1000 outcomes (default 20)",
            );
        }
        if !(1..=1000).contains(&b.consecutive) {
            return bad(
                "--breaker-consecutive",
                "must be between 1 and 1000 failures in a row (default 10)",
            );
        }
        if b.probe_base.is_zero() {
            return bad(
                "--breaker-probe-base",
                "must be greater than 0s (default 1s)",
            );
        }
        if b.probe_max < b.probe_base {
            return bad(
                "--breaker-probe-max",
                "must not be below --breaker-probe-base",
            );
        }
        if b.probe_max > StdDuration::from_hours(12) {
            return bad(
                "--breaker-probe-max",
                "must be at most 12h (a held message cannot outlive SQS's 12 hours of visibility)",
            );
        }
        if b.tolerance.is_some_and(|t| t.is_zero()) {
            return bad(
                "--outage-tolerance",
                "must be greater than 0s; leave it unset to hold messages up to SQS's 12 hours, or use --breaker false",
            );
        }
        if self.max_rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
            return bad(
                "--max-rate",
                "must be a positive number of messages per second, e.g. 6.5 (leave it out for no limit)",
            );
        }
        if self.max_rate_file.is_some() && self.max_rate.is_none() {
            return bad(
                "--max-rate-file",
                "needs --max-rate, the share to use until the file holds one (e.g. maxRate / maxReplicas)",
            );
        }
        if self.idempotency_store != IdempotencyStore::None && self.idempotency_ttl.is_zero() {
            return bad("--idempotency-ttl", "must be greater than 0s");
        }
        match &self.handler {
            HandlerConfig::Http { url } if url.trim().is_empty() => {
                bad("--http-url", "must not be empty")
            }
            HandlerConfig::Exec { command } if command.is_empty() => bad(
                "--exec",
                "needs a command after `--`, e.g. `--exec -- /app/handle`",
            ),
            _ => Ok(()),
        }
    }

    pub fn shutdown_timeout(&self) -> StdDuration {
        self.shutdown_timeout
            .unwrap_or_else(|| self.timeout.saturating_add(Duration::from_secs(5)))
            .as_std()
    }
}

/// Counts reported when the worker stops.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub received: u64,
    pub deleted: u64,
    pub released: u64,
    pub sqs_requests: u64,
}

/// Says where the TLS clients' roots come from when they are not the system's.
fn log_roots(roots: &crate::roots::Roots) {
    match roots {
        crate::roots::Roots::System => {}
        crate::roots::Roots::Bundle { path, count, .. } => tracing::info!(
            bundle = %path.display(),
            certificates = count,
            "no CA roots on this system; TLS (SQS over https, rediss://) trusts the bundle beside qc-worker"
        ),
        crate::roots::Roots::Missing => tracing::warn!(
            "no CA roots: none on this system (SSL_CERT_FILE, SSL_CERT_DIR, the standard bundle) and no \
             ca-certificates.crt beside qc-worker; every https or rediss:// certificate will be refused. \
             Install CA certificates in the image or set SSL_CERT_FILE"
        ),
    }
}

/// Runs the worker until `shutdown` completes and the drain is over; with tracing on
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`), the spans still buffered are exported before it returns.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<Summary, WorkerError> {
    config.validate()?;
    let otlp = telemetry::otlp::Otlp::from_env("qc-worker")?;
    if let Some(o) = &otlp {
        let s = o.settings();
        tracing::info!(endpoint = %s.traces_url, sampler = ?s.sampling, service = %s.service_name, "exporting spans over OTLP");
    }
    let spans = otlp
        .as_ref()
        .map(|o| spans::Spans::new(o.tracer(), &config.queue_url));
    let result = consume(config, shutdown, spans).await;
    if let Some(o) = otlp {
        o.shutdown().await;
    }
    result
}

async fn consume(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    spans: Option<spans::Spans>,
) -> Result<Summary, WorkerError> {
    // Read once at start: a schema that does not compile stops the worker before any receive.
    let schema = config.schema_file.as_deref().map(load_schema).transpose()?;
    let metrics = Arc::new(Metrics::default());
    let listener = telemetry::bind_probes(&config.metrics_addr).await?;
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(addr = %addr, "serving /metrics, /healthz and /readyz");
    }
    let (probes_stop, probes_stopped) = oneshot::channel::<()>();
    tokio::spawn(telemetry::serve_probes(
        listener,
        metrics.clone(),
        async move {
            let _ = probes_stopped.await;
        },
    ));

    // The signal time starts the shutdown budget, whichever phase the worker is in.
    let (signal_tx, signal_rx) = watch::channel::<Option<Instant>>(None);
    tokio::spawn(async move {
        shutdown.await;
        let _ = signal_tx.send(Some(Instant::now()));
    });
    let signalled = {
        let rx = signal_rx.clone();
        move || wait_signal(rx.clone())
    };

    let region = crate::aws::facts::queue_region(config.region.as_deref(), &config.queue_url);
    log_roots(&config.roots);
    let mut sdk = crate::aws::with_app_name(
        crate::aws::sdk_config_trusting(
            region.as_deref(),
            config.endpoint_url.as_deref(),
            &config.roots,
        )
        .await,
        crate::aws::WORKER_APP_NAME,
    );
    if let Some(role) = &config.role {
        sdk = crate::aws::identity::assume(sdk, role).await;
    }
    // The SDK retries a failed request (standard mode, AWS_MAX_ATTEMPTS); a call that still fails is
    // backed off with jitter by the worker, without blocking a slot.
    let sqs = Sqs::new(&sdk, &config.queue_url, metrics.clone())
        .map_err(|reason| WorkerError::SetUpSqs { reason })?;

    let queue = QueueContext {
        url: config.queue_url.clone(),
        arn: String::new(),
    };
    let mut handler = match &config.handler {
        HandlerConfig::Http { url } => Handler::Http(Box::new(HttpHandler::new(
            url,
            &queue,
            config.concurrency as usize,
            config.max_request_head,
        )?)),
        HandlerConfig::Exec { command } => {
            let mut h = ExecHandler::new(command, &queue)?;
            h.pass_aws_credentials(config.exec_pass_aws_credentials);
            Handler::Exec(h)
        }
    };

    let reaper = match &handler {
        Handler::Exec(h) => {
            h.reaper().start();
            Some(h.reaper().clone())
        }
        Handler::Http(_) => None,
    };

    let Some(info) = read_queue(&sqs, &metrics, signalled()).await else {
        let _ = probes_stop.send(());
        return Ok(summary(&metrics));
    };
    let vt = info.visibility_timeout;
    let heartbeat = if config.heartbeat && !vt.is_zero() {
        Some(
            config
                .heartbeat_interval
                .resolve(Duration::from_std(vt))
                .as_std()
                .max(StdDuration::from_millis(100)),
        )
    } else {
        None
    };
    log_start(&config, &info, heartbeat);

    handler.set_queue_arn(&info.arn);
    let prefix = store_prefix(&info.arn, region.as_deref(), &config.queue_url);
    let store = match open_store(&config, &sdk, prefix, &metrics, signalled()).await? {
        Opened::Store(s) => s,
        Opened::Interrupted => {
            let _ = probes_stop.send(());
            return Ok(summary(&metrics));
        }
    };

    metrics.set_readiness(Readiness::Starting(format!(
        "waiting for the handler ({})",
        handler.describe()
    )));
    tokio::select! {
        () = handler.wait_reachable() => {}
        () = signalled() => {
            let _ = probes_stop.send(());
            return Ok(summary(&metrics));
        }
    }

    let (close_tx, close_rx) = watch::channel(false);
    let capacity = 2 * config.concurrency as usize + 100;
    let (deleter, deleter_task) = batcher::spawn(
        sqs.clone(),
        metrics.clone(),
        batcher::Kind::Delete,
        FLUSH_INTERVAL,
        capacity,
        close_rx.clone(),
    );
    let (releaser, releaser_task) = batcher::spawn(
        sqs.clone(),
        metrics.clone(),
        batcher::Kind::Release,
        FLUSH_INTERVAL,
        capacity,
        close_rx,
    );
    let (freed_tx, freed_rx) = mpsc::unbounded_channel();
    let breaker = Arc::new(breaker::Breaker::new(
        breaker::Settings {
            concurrency: config.concurrency as usize,
            ..config.breaker.clone()
        },
        metrics.clone(),
    ));
    let mut processor = Processor::new(
        sqs.clone(),
        metrics.clone(),
        handler,
        store,
        config.idempotency_key.clone(),
        config.idempotency_ttl.as_std(),
        vt,
        heartbeat,
        config.timeout.as_std(),
        config.retry_base.as_std(),
        config.retry_max.as_std(),
        config.on_poison,
        (config.on_poison == OnPoison::DeadLetter)
            .then(|| dead_letter::DeadLetter::new(sqs.client(), &config.queue_url)),
        deleter,
        releaser,
        freed_tx,
        breaker,
    );
    processor.confirm_deletes = info.fifo;
    processor.unwrap_sns = config.unwrap_sns;
    if let Some(settings) = config.s3_payloads.clone() {
        processor.s3 = Some(s3::S3Payloads::new(&sdk, settings));
    }
    processor.schema = schema;
    processor.spans = spans;
    if !config.filter.is_empty() {
        let filter = self::core::filter::Filter::parse(&config.filter).map_err(|e| {
            WorkerError::ValidateFlags {
                flag: "--filter",
                reason: e.to_string(),
            }
        })?;
        processor.filter = Some(filter);
    }
    let processor = Arc::new(processor);

    let total = config.shutdown_timeout();
    // Room after the handlers for the last deletes and releases.
    let flush_reserve = (total / 4).min(StdDuration::from_secs(3));
    // What may be held ahead: the waiting batch, and the rest for the early receive.
    let ahead = prefetch(
        config.batch_size,
        config.concurrency,
        heartbeat.is_some(),
        info.fifo,
    );
    let settings = dispatch::Settings {
        concurrency: config.concurrency as usize,
        batch_size: config.batch_size as usize,
        wait_time: config.wait_time.as_std(),
        fifo: info.fifo,
        prefetch: ahead.min(config.batch_size) as usize,
        early_max: ahead.saturating_sub(config.batch_size) as usize,
        heartbeat,
        drain_budget: total.saturating_sub(flush_reserve),
        batch: (config.batch_max_items > 1).then(|| dispatch::BatchSettings {
            max_items: config.batch_max_items as usize,
            max_wait: config.batch_max_wait.as_std(),
            prefetch_calls: batch_prefetch_calls(config.concurrency, heartbeat.is_some(), info.fifo)
                as usize,
        }),
        rate: config
            .max_rate
            .map(|r| rate::watch_share(config.max_rate_file.clone(), r, rate::SHARE_POLL)),
    };
    metrics.set_readiness(Readiness::Ready);
    tracing::info!("consuming");
    dispatch::Dispatcher::new(processor, settings, freed_rx)
        .run(signalled())
        .await;

    let signal_at = (*signal_rx.borrow()).unwrap_or_else(Instant::now);
    let deadline = signal_at + total.saturating_sub(StdDuration::from_millis(100));
    let _ = close_tx.send(true);
    let flushed = tokio::time::timeout_at(deadline, async {
        let _ = deleter_task.await;
        let _ = releaser_task.await;
    })
    .await;
    if flushed.is_err() {
        tracing::error!(
            "shutdown budget spent before all deletes were sent; those messages will be delivered again"
        );
    }
    if let Some(r) = &reaper {
        r.kill_strays().await;
    }
    let _ = probes_stop.send(());
    let s = summary(&metrics);
    tracing::info!(
        received = s.received,
        deleted = s.deleted,
        released = s.released,
        sqs_requests = s.sqs_requests,
        elapsed_ms = signal_at.elapsed().as_millis() as u64,
        "stopped"
    );
    Ok(s)
}

async fn wait_signal(mut rx: watch::Receiver<Option<Instant>>) {
    let _ = rx.wait_for(std::option::Option::is_some).await;
}

fn summary(m: &Metrics) -> Summary {
    Summary {
        received: m.received.get(),
        deleted: m.deleted.get(),
        released: m.released.get(),
        sqs_requests: m.sqs_requests_total(),
    }
}

/// Reads the queue's attributes, retrying with backoff; None if shut down first.
async fn read_queue(
    sqs: &Sqs,
    metrics: &Metrics,
    signalled: impl std::future::Future<Output = ()>,
) -> Option<QueueInfo> {
    tokio::pin!(signalled);
    let mut attempt = 0u32;
    loop {
        match sqs.queue_info().await {
            Ok(info) => return Some(info),
            Err(e) => {
                attempt = attempt.saturating_add(1);
                let delay = backoff::error_backoff(attempt, fastrand::f64());
                if e.kind.is_configuration() {
                    tracing::error!(queue_url = sqs.url(), reason = e.kind.reason(), error = %e.detail, hint = e.hint(), retry_in_ms = delay.as_millis() as u64, "cannot read the queue; not ready");
                    metrics.set_readiness(Readiness::Failing(format!(
                        "{}: {}",
                        e.kind.reason(),
                        e.hint()
                    )));
                } else {
                    tracing::warn!(queue_url = sqs.url(), reason = e.kind.reason(), error = %e.detail, attempt, retry_in_ms = delay.as_millis() as u64, "cannot read the queue; retrying");
                    metrics.set_readiness(Readiness::Starting(format!(
                        "reading queue attributes: {}",
                        e.kind.reason()
                    )));
                }
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = &mut signalled => return None,
                }
            }
        }
    }
}

enum Opened {
    Store(Option<Store>),
    Interrupted,
}

/// The prefix of this queue's idempotency keys in a shared store: the queue's ARN (partition, region,
/// account and name), so two queues of one name in two regions or accounts sharing a redis never
/// take each other's keys for their own (each would delete the other's messages as duplicates).
/// Without an ARN (an endpoint that gives none), region, account and name from the URL.
fn store_prefix(arn: &str, region: Option<&str>, url: &str) -> String {
    if arn.is_empty() {
        let id = crate::aws::QueueId::of(region, url);
        format!(
            "qc:idem:{}:{}:{}:",
            id.region.as_deref().unwrap_or("-"),
            id.account,
            id.name
        )
    } else {
        format!("qc:idem:{arn}:")
    }
}

async fn open_store(
    config: &Config,
    sdk: &aws_types::SdkConfig,
    prefix: String,
    metrics: &Metrics,
    signalled: impl std::future::Future<Output = ()>,
) -> Result<Opened, WorkerError> {
    tokio::pin!(signalled);
    match config.idempotency_store {
        IdempotencyStore::None => Ok(Opened::Store(None)),
        IdempotencyStore::Memory => Ok(Opened::Store(Some(Store::Memory(MemoryStore::new(
            MEMORY_STORE_CAPACITY,
        ))))),
        IdempotencyStore::DynamoDb => {
            let Some(settings) = config.dynamodb.clone() else {
                return Err(WorkerError::ValidateFlags {
                    flag: "--dynamodb-table",
                    reason: "is required with --idempotency-store dynamodb".into(),
                });
            };
            let store = Store::DynamoDb(DynamoStore::new(sdk, settings, prefix));
            // Not ready until the table answers, as for redis.
            let mut attempt = 0u32;
            loop {
                match store.ping().await {
                    Ok(()) => return Ok(Opened::Store(Some(store))),
                    Err(e) => {
                        attempt = attempt.saturating_add(1);
                        let delay = backoff::error_backoff(attempt, fastrand::f64());
                        tracing::error!(error = %e, attempt, retry_in_ms = delay.as_millis() as u64, "idempotency store unreachable; not ready");
                        metrics.set_readiness(Readiness::Failing(e.to_string()));
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = &mut signalled => return Ok(Opened::Interrupted),
                        }
                    }
                }
            }
        }
        IdempotencyStore::Redis => {
            let url = config.redis_url.clone().unwrap_or_default();
            if let Err(e) = redis::Client::open(url.as_str()) {
                // A malformed URL never heals: stop with the reason instead of retrying forever.
                return Err(WorkerError::ValidateFlags {
                    flag: "--redis-url",
                    reason: format!("{}: {e}", idempotency::redact(&url)),
                });
            }
            let mut attempt = 0u32;
            loop {
                match RedisStore::connect(&url, prefix.clone(), &config.roots).await {
                    Ok(s) => return Ok(Opened::Store(Some(Store::Redis(s)))),
                    Err(e) => {
                        attempt = attempt.saturating_add(1);
                        let delay = backoff::error_backoff(attempt, fastrand::f64());
                        tracing::error!(error = %e, attempt, retry_in_ms = delay.as_millis() as u64, "idempotency store unreachable; not ready");
                        metrics.set_readiness(Readiness::Failing(e.to_string()));
                        tokio::select! {
                            () = tokio::time::sleep(delay) => {}
                            () = &mut signalled => return Ok(Opened::Interrupted),
                        }
                    }
                }
            }
        }
    }
}

/// Reads and compiles `--schema-file`; the error names the file and the fix.
fn load_schema(path: &std::path::Path) -> Result<self::core::schema::Schema, WorkerError> {
    let err = |reason: String| WorkerError::LoadSchema {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    self::core::schema::Schema::compile(&text).map_err(|e| err(e.to_string()))
}

/// The queue's name: the last path segment of its URL.
pub use crate::aws::facts::queue_name_from_url as queue_name;

fn log_start(config: &Config, info: &QueueInfo, heartbeat: Option<StdDuration>) {
    let vt = info.visibility_timeout;
    tracing::info!(
        queue_url = %config.queue_url,
        fifo = info.fifo,
        visibility_timeout_s = vt.as_secs(),
        max_receive_count = info.max_receive_count,
        concurrency = config.concurrency,
        batch_size = config.batch_size,
        wait_time = %config.wait_time,
        timeout = %config.timeout,
        heartbeat_interval_ms = heartbeat.map(|h| h.as_millis() as u64),
        on_poison = config.on_poison.as_str(),
        unwrap_sns = config.unwrap_sns.as_str(),
        s3_payloads = config.s3_payloads.is_some(),
        schema_file = config.schema_file.as_ref().map(|p| p.display().to_string()),
        filter_patterns = config.filter.len(),
        batch_max_items = config.batch_max_items,
        batch_max_wait = %config.batch_max_wait,
        idempotency_store = config.idempotency_store.as_str(),
        breaker = config.breaker.enabled,
        outage_tolerance_s = config.breaker.tolerance.map(|t| t.as_secs()),
        max_rate = config.max_rate,
        max_rate_file = config.max_rate_file.as_ref().map(|p| p.display().to_string()),
        shutdown_timeout_ms = config.shutdown_timeout().as_millis() as u64,
        "queue read"
    );
    if let Some(h) = heartbeat {
        if h >= vt {
            tracing::warn!(
                heartbeat_interval_ms = h.as_millis() as u64,
                visibility_timeout_s = vt.as_secs(),
                "heartbeat interval is not shorter than the visibility timeout: leases will lapse; use --heartbeat-interval auto"
            );
        }
    } else if config.timeout.as_std() > vt {
        tracing::warn!(
            timeout = %config.timeout,
            visibility_timeout_s = vt.as_secs(),
            "handler timeout exceeds the visibility timeout and heartbeats are off: slow messages will be delivered twice"
        );
    }
    if info.max_receive_count.is_none() {
        tracing::warn!(
            "queue has no redrive policy: messages that keep failing are retried until they expire"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config {
            queue_url: "http://localhost/1/q".into(),
            region: None,
            endpoint_url: None,
            role: None,
            concurrency: 10,
            batch_size: 10,
            wait_time: Duration::from_secs(20),
            timeout: Duration::from_secs(30),
            heartbeat: true,
            heartbeat_interval: HeartbeatInterval::Auto,
            retry_base: Duration::from_secs(5),
            retry_max: Duration::from_secs(900),
            on_poison: OnPoison::DeadLetter,
            unwrap_sns: UnwrapSns::Off,
            batch_max_items: 1,
            batch_max_wait: Duration::from_secs(1),
            exec_pass_aws_credentials: false,
            s3_payloads: None,
            schema_file: None,
            dynamodb: None,
            filter: Vec::new(),
            idempotency_store: IdempotencyStore::None,
            idempotency_key: IdempotencyKey::MessageId,
            idempotency_ttl: Duration::from_secs(86_400),
            redis_url: None,
            metrics_addr: "127.0.0.1:0".into(),
            max_request_head: handler::DEFAULT_MAX_HEAD,
            shutdown_timeout: None,
            breaker: breaker::Settings::default(),
            max_rate: None,
            max_rate_file: None,
            handler: HandlerConfig::Http {
                url: "http://127.0.0.1:8080/messages".into(),
            },
            roots: crate::roots::Roots::System,
        }
    }

    fn flag_of(c: &Config) -> Option<&'static str> {
        match c.validate() {
            Err(WorkerError::ValidateFlags { flag, .. }) => Some(flag),
            _ => None,
        }
    }

    #[test]
    fn validation_names_the_flag() {
        type Mutation = Box<dyn Fn(&mut Config)>;
        assert_eq!(flag_of(&config()), None);
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|c| c.batch_size = 11), "--batch-size"),
            (Box::new(|c| c.batch_size = 0), "--batch-size"),
            (Box::new(|c| c.concurrency = 0), "--concurrency"),
            (Box::new(|c| c.concurrency = u32::MAX), "--concurrency"),
            (
                Box::new(|c| c.region = Some("us-east-1\r\nx: y".into())),
                "--region",
            ),
            (
                Box::new(|c| c.queue_url = "http://h/1/q\r\nx: y".into()),
                "--queue-url",
            ),
            (
                Box::new(|c| c.wait_time = Duration::from_secs(21)),
                "--wait-time",
            ),
            (Box::new(|c| c.timeout = Duration::ZERO), "--timeout"),
            (
                Box::new(|c| c.retry_max = Duration::from_secs(1)),
                "--retry-max",
            ),
            (
                Box::new(|c| c.idempotency_store = IdempotencyStore::Redis),
                "--redis-url",
            ),
            (
                Box::new(|c| c.handler = HandlerConfig::Exec { command: vec![] }),
                "--exec",
            ),
            (
                Box::new(|c| c.heartbeat_interval = HeartbeatInterval::Fixed(Duration::ZERO)),
                "--heartbeat-interval",
            ),
            (Box::new(|c| c.max_request_head = 100), "--max-request-head"),
            (
                Box::new(|c| c.breaker.failure_percent = 0),
                "--breaker-failure-percent",
            ),
            (
                Box::new(|c| c.breaker.failure_percent = 101),
                "--breaker-failure-percent",
            ),
            (Box::new(|c| c.breaker.window = 1), "--breaker-window"),
            (
                Box::new(|c| c.breaker.consecutive = 0),
                "--breaker-consecutive",
            ),
            (
                Box::new(|c| c.breaker.probe_base = StdDuration::ZERO),
                "--breaker-probe-base",
            ),
            (
                Box::new(|c| c.breaker.probe_max = StdDuration::from_millis(500)),
                "--breaker-probe-max",
            ),
            (
                Box::new(|c| c.breaker.tolerance = Some(StdDuration::ZERO)),
                "--outage-tolerance",
            ),
            (
                Box::new(|c| c.max_request_head = 2 * MAX_REQUEST_HEAD),
                "--max-request-head",
            ),
        ];
        for (mutate, flag) in cases {
            let mut c = config();
            mutate(&mut c);
            assert_eq!(flag_of(&c), Some(flag));
        }
    }

    #[test]
    fn shutdown_timeout_defaults_to_timeout_plus_margin() {
        assert_eq!(config().shutdown_timeout(), StdDuration::from_secs(35));
        let mut c = config();
        c.shutdown_timeout = Some(Duration::from_secs(7));
        assert_eq!(c.shutdown_timeout(), StdDuration::from_secs(7));
    }

    #[test]
    fn store_keys_name_the_queue_by_arn_or_region_account_and_name() {
        let east = store_prefix(
            "arn:aws:sqs:us-east-1:111111111111:orders",
            Some("us-east-1"),
            "https://sqs.us-east-1.amazonaws.com/111111111111/orders",
        );
        let west = store_prefix(
            "arn:aws:sqs:us-west-2:111111111111:orders",
            Some("us-west-2"),
            "https://sqs.us-west-2.amazonaws.com/111111111111/orders",
        );
        let other_account = store_prefix(
            "arn:aws:sqs:us-east-1:222222222222:orders",
            Some("us-east-1"),
            "https://sqs.us-east-1.amazonaws.com/222222222222/orders",
        );
        assert_eq!(east, "qc:idem:arn:aws:sqs:us-east-1:111111111111:orders:");
        assert_ne!(east, west);
        assert_ne!(east, other_account);
        // No ARN from the endpoint: the URL's account and name, and the region.
        assert_eq!(
            store_prefix(
                "",
                Some("eu-west-1"),
                "http://localhost:4566/000000000000/orders"
            ),
            "qc:idem:eu-west-1:000000000000:orders:"
        );
    }

    #[test]
    fn queue_name_is_the_last_segment() {
        assert_eq!(
            queue_name("https://sqs.us-east-1.amazonaws.com/1/orders.fifo"),
            "orders.fifo"
        );
        assert_eq!(queue_name("http://h/1/q/"), "q");
    }
}
