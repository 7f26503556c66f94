//! `qc-worker`: the bundled SQS consumer's command line (argument parsing, signals and wiring only).
//! Every flag is also read from `QC_<FLAG>` in the environment, as the controller renders them. The
//! `qc-worker` binary is this and nothing else; `qc-operator` runs it too when started under the name
//! `qc-worker`, which is how the image holds both as one file (docs/image.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::api::{
    Duration, HeartbeatInterval, IdempotencyKey, IdempotencyStore, OnPoison, UnwrapSns,
};
use crate::worker::{Config, HandlerConfig};
use anyhow::Context as _;
use clap::{ArgAction, Parser};

#[derive(Parser, Debug)]
#[command(
    name = "qc-worker",
    version,
    about = "Consume an Amazon SQS queue: receive, hand each message to a handler, delete on success",
    after_help = "Handlers: --http-url http://127.0.0.1:8080/messages, or --exec -- COMMAND [ARGS...]"
)]
// Command-line switches are bools by nature; clap maps each to one flag.
#[allow(clippy::struct_excessive_bools)]
struct Cli {
    /// Copy this executable to PATH (mode 0755), and this system's CA roots beside it as
    /// ca-certificates.crt, then exit; for an init container. The copy trusts that bundle only where its
    /// system has no CA roots.
    #[arg(long, env = "QC_COPY_SELF_TO", value_name = "PATH")]
    copy_self_to: Option<PathBuf>,

    /// URL of the queue to consume.
    #[arg(long, env = "QC_QUEUE_URL", required_unless_present = "copy_self_to")]
    queue_url: Option<String>,
    /// AWS region (default: from the queue URL, else the environment).
    #[arg(long, env = "QC_REGION")]
    region: Option<String>,
    /// SQS endpoint override, for local emulators.
    #[arg(long, env = "QC_ENDPOINT_URL")]
    endpoint_url: Option<String>,
    /// IAM role to assume (STS AssumeRole) with the pod's own credentials (IRSA, EKS Pod Identity)
    /// for every SQS call: the QueueConsumer's spec.aws.roleArn.
    #[arg(long, env = "QC_ROLE_ARN", value_name = "ARN")]
    role_arn: Option<String>,
    /// Session name of the assumed role (the controller renders qc-NAMESPACE.NAME).
    #[arg(
        long,
        env = "QC_ROLE_SESSION_NAME",
        default_value = "qc-worker",
        requires = "role_arn"
    )]
    role_session_name: String,
    /// ExternalId presented when assuming the role (the controller renders qc:NAMESPACE).
    #[arg(long, env = "QC_ROLE_EXTERNAL_ID", requires = "role_arn")]
    role_external_id: Option<String>,

    /// Messages handled at once.
    #[arg(long, env = "QC_CONCURRENCY", default_value_t = 10)]
    concurrency: u32,
    /// MaxNumberOfMessages per receive (1..10).
    #[arg(long, env = "QC_BATCH_SIZE", default_value_t = 10)]
    batch_size: u32,
    /// Long-poll wait per receive (0s..20s).
    #[arg(long, env = "QC_WAIT_TIME", default_value = "20s")]
    wait_time: Duration,
    /// Per-message handler timeout; a timeout is a transient failure.
    #[arg(long, env = "QC_TIMEOUT", default_value = "30s")]
    timeout: Duration,

    /// Extend the visibility of in-flight messages.
    #[arg(long, env = "QC_HEARTBEAT", default_value_t = true, action = ArgAction::Set, value_name = "true|false")]
    heartbeat: bool,
    /// Delay of the first heartbeat after the receive: auto (a third of the queue's visibility
    /// timeout) or a duration; later extensions double (up to --timeout, at most 15m) and their
    /// beats spread out in proportion.
    #[arg(long, env = "QC_HEARTBEAT_INTERVAL", default_value = "auto")]
    heartbeat_interval: HeartbeatInterval,

    /// Visibility after a transient failure on the first receive; doubles per receive.
    #[arg(long, env = "QC_RETRY_BASE", default_value = "5s")]
    retry_base: Duration,
    /// Cap of the retry delay (and never above 12h).
    #[arg(long, env = "QC_RETRY_MAX", default_value = "15m")]
    retry_max: Duration,
    /// Poison messages: dead-letter (send to the redrive policy's DLQ now, then delete from the
    /// source; leave without a DLQ), leave (for the redrive policy), or delete (gone).
    #[arg(long, env = "QC_ON_POISON", default_value = "dead-letter", value_parser = parse_on_poison)]
    on_poison: OnPoison,
    /// SNS envelopes: on (every message is a notification: the handler gets its Message and
    /// MessageAttributes), auto (only messages that are notifications), off (as received).
    #[arg(long, env = "QC_UNWRAP_SNS", default_value = "off", value_parser = parse_unwrap_sns, value_name = "off|on|auto")]
    unwrap_sns: UnwrapSns,
    /// Batch mode: up to this many messages per handler call (HTTP: a JSON array of CloudEvents,
    /// `application/cloudevents-batch+json`; exec: one event per line on stdin, the answer in the
    /// file $QC_BATCH_ANSWER_FILE names), the answer naming failed items in `batchItemFailures`;
    /// --concurrency then counts calls. 1: one message a call.
    #[arg(long, env = "QC_BATCH_MAX_ITEMS", default_value_t = 1)]
    batch_max_items: u32,
    /// Batch mode: a call starts with fewer messages once the oldest has waited this long.
    #[arg(long, env = "QC_BATCH_MAX_WAIT", default_value = "1s")]
    batch_max_wait: Duration,
    /// Exec handler: pass the static AWS keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_SESSION_TOKEN) on to its processes. Without it they get the environment minus those
    /// keys and the worker's secrets (QC_REDIS_URL).
    #[arg(long, env = "QC_EXEC_PASS_AWS_CREDENTIALS")]
    exec_pass_aws_credentials: bool,
    /// Fetch the payload of an Amazon SQS Extended Client message (a body pointing at an S3 object)
    /// and hand it to the handler as the body; a missing object is poison, an S3 failure a retry.
    #[arg(long, env = "QC_S3_PAYLOADS")]
    s3_payloads: bool,
    /// With --s3-payloads (required): a bucket payloads may come from, a name or a pattern with `*`
    /// or `?`; repeat for more. A pointer into any other bucket is poison, never fetched.
    #[arg(
        long = "s3-bucket",
        env = "QC_S3_BUCKETS",
        value_delimiter = ',',
        value_name = "BUCKET"
    )]
    s3_buckets: Vec<String>,
    /// A filter pattern in Lambda's FilterCriteria syntax (spec.filter.patterns), repeat for more: a
    /// message no pattern matches is deleted without a handler call.
    #[arg(long = "filter", value_name = "PATTERN")]
    filter: Vec<String>,
    /// A JSON Schema file (handler.schema): a body that is not JSON or does not match it is poison,
    /// with the first validation error as its reason, before any handler call.
    #[arg(long, env = "QC_SCHEMA_FILE")]
    schema_file: Option<PathBuf>,
    /// With --s3-payloads: delete the object once the message's delete is confirmed.
    #[arg(long, env = "QC_S3_DELETE_AFTER")]
    s3_delete_after: bool,
    /// With --s3-payloads: payload bytes held at once (bytes, or with KiB/MiB); a fetch past it waits
    /// for payloads to be released, one larger than all of it is poison. Default: half the
    /// container's memory limit (cgroup memory.max or memory.limit_in_bytes), else 512MiB.
    #[arg(long, env = "QC_S3_PAYLOAD_BUDGET", value_parser = parse_size)]
    s3_payload_budget: Option<usize>,
    /// With --s3-payloads: the largest payload fetched (bytes, or with KiB/MiB); a larger one is poison.
    #[arg(long, env = "QC_S3_PAYLOAD_MAX", default_value = "64MiB", value_parser = parse_size)]
    s3_payload_max: usize,

    /// none | memory | redis
    #[arg(long, env = "QC_IDEMPOTENCY_STORE", default_value = "none", value_parser = parse_store)]
    idempotency_store: IdempotencyStore,
    /// messageId | jsonPointer:/a/b | attribute:NAME
    #[arg(long, env = "QC_IDEMPOTENCY_KEY", default_value = "messageId")]
    idempotency_key: IdempotencyKey,
    /// How long a finished key is remembered.
    #[arg(long, env = "QC_IDEMPOTENCY_TTL", default_value = "24h")]
    idempotency_ttl: Duration,
    /// Redis URL for --idempotency-store redis.
    #[arg(long, env = "QC_REDIS_URL", hide_env_values = true)]
    redis_url: Option<String>,
    /// DynamoDB table for --idempotency-store dynamodb (called with the worker's own identity).
    #[arg(long, env = "QC_DYNAMODB_TABLE")]
    dynamodb_table: Option<String>,
    /// The table's partition key attribute (a String).
    #[arg(long, env = "QC_DYNAMODB_KEY_ATTRIBUTE", default_value = "id")]
    dynamodb_key_attribute: String,
    /// The attribute holding each item's expiry in epoch seconds (the table's TTL attribute).
    #[arg(long, env = "QC_DYNAMODB_TTL_ATTRIBUTE", default_value = "expiresAt")]
    dynamodb_ttl_attribute: String,

    /// Cap of the HTTP handler's request head (bytes, or with KiB/MiB); attributes that do not fit are
    /// left out and named in the x-qc-omitted-attributes header.
    #[arg(long, env = "QC_MAX_REQUEST_HEAD", default_value = "8KiB", value_parser = parse_size)]
    max_request_head: usize,

    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "QC_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    metrics_addr: String,
    /// Longest drain after SIGTERM/SIGINT (default: --timeout plus 5s).
    #[arg(long, env = "QC_SHUTDOWN_TIMEOUT")]
    shutdown_timeout: Option<Duration>,

    /// Outage breaker: pause receiving while the handler's dependency fails (transient failures
    /// over the thresholds below, HTTP 503 with Retry-After, exit 75), keep the messages in hand
    /// under heartbeats and probe with one of them, instead of burning their receives toward the DLQ.
    #[arg(long, env = "QC_BREAKER", default_value_t = true, action = ArgAction::Set, value_name = "true|false")]
    breaker: bool,
    /// Opens when at least this percentage of the last --breaker-window outcomes failed (1..100).
    #[arg(long, env = "QC_BREAKER_FAILURE_PERCENT", default_value_t = 50)]
    breaker_failure_percent: u32,
    /// Outcomes in the breaker's window (within the last minute); the percentage applies once it is full.
    #[arg(long, env = "QC_BREAKER_WINDOW", default_value_t = 20)]
    breaker_window: usize,
    /// Opens after this many transient failures in a row (low traffic).
    #[arg(long, env = "QC_BREAKER_CONSECUTIVE", default_value_t = 10)]
    breaker_consecutive: u32,
    /// First probe delay while open; doubles per failed probe, jittered.
    #[arg(long, env = "QC_BREAKER_PROBE_BASE", default_value = "1s")]
    breaker_probe_base: Duration,
    /// Longest probe delay.
    #[arg(long, env = "QC_BREAKER_PROBE_MAX", default_value = "30s")]
    breaker_probe_max: Duration,
    /// After the breaker has been open this long, held messages follow the normal retries toward
    /// the DLQ (default: 1h, `worker::breaker::DEFAULT_OUTAGE_TOLERANCE`).
    #[arg(long, env = "QC_OUTAGE_TOLERANCE")]
    outage_tolerance: Option<Duration>,

    /// Messages per second this worker starts at most (its share of processing.maxRate), until
    /// --max-rate-file holds a share. Default: unlimited.
    #[arg(long, env = "QC_MAX_RATE", value_parser = parse_rate)]
    max_rate: Option<f64>,
    /// A file holding this worker's share in messages per second (the controller's pod annotation
    /// through a downward-API volume); re-read every 2s, an unreadable value keeps the last good one.
    #[arg(long, env = "QC_MAX_RATE_FILE")]
    max_rate_file: Option<PathBuf>,

    /// HTTP handler: POST each message here (CloudEvents binary mode).
    #[arg(long, env = "QC_HTTP_URL", conflicts_with = "exec")]
    http_url: Option<String>,
    /// Exec handler: run the command after `--` per message, body on stdin.
    #[arg(long, env = "QC_EXEC", action = ArgAction::SetTrue)]
    exec: bool,
    /// The exec handler's command and arguments (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    crate::worker::rate::parse_share(s)
}

fn parse_unwrap_sns(s: &str) -> Result<UnwrapSns, String> {
    s.parse()
}

fn parse_on_poison(s: &str) -> Result<OnPoison, String> {
    s.parse()
}

/// A byte size: `8192`, `8KiB`, `1MiB`.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, unit) = match t.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => t.split_at(i),
        None => (t, ""),
    };
    let factor = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return Err(format!("{s:?}: use bytes, KiB or MiB, e.g. 8KiB")),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("{s:?}: use bytes, KiB or MiB, e.g. 8KiB"))
}

fn parse_store(s: &str) -> Result<IdempotencyStore, String> {
    match s {
        "none" => Ok(IdempotencyStore::None),
        "memory" => Ok(IdempotencyStore::Memory),
        "redis" => Ok(IdempotencyStore::Redis),
        "dynamodb" => Ok(IdempotencyStore::DynamoDb),
        _ => Err(format!("{s:?}: use none, memory, redis or dynamodb")),
    }
}

fn config(cli: Cli) -> anyhow::Result<Config> {
    if cli.s3_delete_after && !cli.s3_payloads {
        anyhow::bail!(
            "invalid --s3-delete-after: needs --s3-payloads (only fetched payloads are deleted)"
        );
    }
    let handler = match (cli.http_url, cli.exec, cli.command.is_empty()) {
        (Some(url), false, true) => HandlerConfig::Http { url },
        (None, true, false) => HandlerConfig::Exec {
            command: cli.command,
        },
        (None, true, true) => anyhow::bail!(
            "invalid --exec: give the command after `--`, e.g. `qc-worker ... --exec -- /app/handle`"
        ),
        (Some(_), _, false) | (None, false, false) => anyhow::bail!(
            "a command after `--` needs --exec (and no --http-url): `qc-worker ... --exec -- COMMAND`"
        ),
        (Some(_), true, _) => anyhow::bail!("choose one handler: --http-url or --exec, not both"),
        (None, false, true) => anyhow::bail!(
            "no handler: pass --http-url http://127.0.0.1:8080/messages or --exec -- COMMAND"
        ),
    };
    Ok(Config {
        queue_url: cli.queue_url.unwrap_or_default(),
        region: cli.region,
        endpoint_url: cli.endpoint_url,
        role: cli.role_arn.map(|arn| crate::aws::identity::Role {
            arn,
            session_name: cli.role_session_name,
            external_id: cli.role_external_id.unwrap_or_default(),
        }),
        concurrency: cli.concurrency,
        batch_size: cli.batch_size,
        wait_time: cli.wait_time,
        timeout: cli.timeout,
        heartbeat: cli.heartbeat,
        heartbeat_interval: cli.heartbeat_interval,
        retry_base: cli.retry_base,
        retry_max: cli.retry_max,
        on_poison: cli.on_poison,
        unwrap_sns: cli.unwrap_sns,
        batch_max_items: cli.batch_max_items,
        batch_max_wait: cli.batch_max_wait,
        exec_pass_aws_credentials: cli.exec_pass_aws_credentials,
        s3_payloads: cli.s3_payloads.then_some(crate::worker::s3::Settings {
            delete_after: cli.s3_delete_after,
            max_bytes: cli.s3_payload_max as u64,
            buckets: cli.s3_buckets,
            budget: cli
                .s3_payload_budget
                .map_or_else(crate::worker::s3::default_budget, |b| b as u64),
        }),
        schema_file: cli.schema_file,
        filter: cli.filter,
        idempotency_store: cli.idempotency_store,
        idempotency_key: cli.idempotency_key,
        idempotency_ttl: cli.idempotency_ttl,
        redis_url: cli.redis_url,
        dynamodb: cli
            .dynamodb_table
            .map(|table| crate::worker::idempotency::DynamoSettings {
                table,
                key_attribute: cli.dynamodb_key_attribute,
                ttl_attribute: cli.dynamodb_ttl_attribute,
            }),
        metrics_addr: cli.metrics_addr,
        max_request_head: cli.max_request_head,
        shutdown_timeout: cli.shutdown_timeout,
        breaker: crate::worker::breaker::Settings {
            enabled: cli.breaker,
            failure_percent: cli.breaker_failure_percent,
            window: cli.breaker_window,
            consecutive: cli.breaker_consecutive,
            probe_base: cli.breaker_probe_base.as_std(),
            probe_max: cli.breaker_probe_max.as_std(),
            tolerance: Some(
                cli.outage_tolerance
                    .map_or(crate::worker::breaker::DEFAULT_OUTAGE_TOLERANCE, |t| {
                        t.as_std()
                    }),
            ),
            concurrency: cli.concurrency as usize,
        },
        max_rate: cli.max_rate,
        max_rate_file: cli.max_rate_file,
        handler,
        // Chosen in main, once the environment is checked.
        roots: crate::roots::Roots::System,
    })
}

fn copy_self(to: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().context("cannot find this executable")?;
    // The roots first: a copied binary always finds the bundle it was copied with. Without roots here
    // there is nothing to copy, and the copy relies on its own system's.
    let bundle = to.with_file_name(crate::roots::BUNDLE_FILE);
    if crate::roots::write_system_bundle(&bundle)? == 0 {
        eprintln!(
            "warning: no CA roots on this system to copy to {}; the copied qc-worker will use its own system's",
            bundle.display()
        );
    }
    // Write next to the target and rename, so a half-copied binary is never executed.
    let tmp = to.with_extension("partial");
    std::fs::copy(&me, &tmp)
        .with_context(|| format!("cannot copy {} to {}", me.display(), tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("cannot make {} executable", tmp.display()))?;
    std::fs::rename(&tmp, to)
        .with_context(|| format!("cannot move {} to {}", tmp.display(), to.display()))?;
    Ok(())
}

async fn signalled() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    if let (Ok(mut term), Ok(mut int)) = (term, int) {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "signal received"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "signal received"),
        }
    } else {
        tracing::error!("cannot install signal handlers; stop with SIGKILL");
        std::future::pending::<()>().await;
    }
}

/// TOKIO_WORKER_THREADS: unset for one thread, else a whole number of threads from 1 to 1024.
fn worker_threads(value: Option<std::ffi::OsString>) -> Result<Option<usize>, String> {
    let Some(value) = value else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(n @ 1..=1024) => Ok(Some(n)),
        _ => Err(format!(
            "invalid TOKIO_WORKER_THREADS={text:?}: give a whole number of threads from 1 to 1024 (e.g. 2), or unset it for the default single-threaded runtime"
        )),
    }
}

/// `SSL_CERT_FILE`, when set, must name a readable file holding at least one PEM certificate: the
/// TLS clients (SQS over https, rediss://) trust only what it holds, so an empty or wrong file would
/// fail every https call later with a bare certificate error.
fn check_ssl_cert_file(value: Option<std::ffi::OsString>) -> Result<(), String> {
    let Some(value) = value else { return Ok(()) };
    let path = std::path::PathBuf::from(&value);
    let fix = "point it at a PEM bundle of CA certificates (e.g. /etc/ssl/certs/ca-certificates.crt) or unset it";
    if value.is_empty() {
        return Err(format!("invalid SSL_CERT_FILE: it is set but empty; {fix}"));
    }
    let text = std::fs::read(&path).map_err(|e| {
        format!(
            "invalid SSL_CERT_FILE={}: cannot read it ({e}); {fix}",
            path.display()
        )
    })?;
    if !text.windows(CERT_MARKER.len()).any(|w| w == CERT_MARKER) {
        return Err(format!(
            "invalid SSL_CERT_FILE={}: it holds no PEM certificate ({} bytes), so no https server could be trusted; {fix}",
            path.display(),
            text.len()
        ));
    }
    Ok(())
}

const CERT_MARKER: &[u8] = b"-----BEGIN CERTIFICATE-----";

/// `qc-worker invoke`: one made-up message (or, with `--batch`, a batch of them) to a local handler,
/// as the worker would send it.
#[derive(Parser, Debug)]
#[command(
    name = "qc-worker invoke",
    about = "Send one message to a local handler exactly as qc-worker would (CloudEvent headers or the exec environment, the timeout) and print what the worker would do with the answer; with --batch, several messages in one batch call and how the answer was read for each",
    after_help = "Exit status: 0 success (deleted; with --batch: every message deleted), 65 poison, 75 retry (with --batch: any message retried), 2 bad flags.\nExamples:\n  qc-worker invoke --body order.json --attribute tenant=t-1 --http-url http://127.0.0.1:8080/messages\n  printf '%s\\n' '{\"orderId\":\"o-1\"}' 'not JSON' | qc-worker invoke --batch --http-url http://127.0.0.1:8080/batch"
)]
struct InvokeCli {
    /// The message body: a file, or - for stdin (the default). With --batch, repeat it: each file is
    /// one message of the batch; without --body, each non-empty line of stdin is one.
    #[arg(long = "body", value_name = "FILE")]
    bodies: Vec<PathBuf>,
    /// Hand the messages to the handler in one batch call, as the worker does with
    /// --batch-max-items (HTTP: a JSON array of CloudEvents; exec: JSON lines on stdin and the
    /// answer in $QC_BATCH_ANSWER_FILE), and print how the answer was read for each message.
    #[arg(long, action = ArgAction::SetTrue)]
    batch: bool,
    /// A String message attribute (repeat for more; with --batch, every message gets them).
    #[arg(long = "attribute", value_name = "NAME=VALUE")]
    attributes: Vec<String>,
    /// The message id (default 00000000-0000-4000-8000-000000000001; with --batch, repeat it once
    /// per message, or leave it out for ...0001, ...0002 and so on).
    #[arg(long = "message-id", value_name = "ID")]
    message_ids: Vec<String>,
    /// ApproximateReceiveCount the handler sees (a redelivery: 2 or more).
    #[arg(long, default_value_t = 1)]
    receive_count: u32,
    /// MessageGroupId, as on a FIFO queue.
    #[arg(long)]
    group_id: Option<String>,
    /// The handler's timeout, as --timeout of the worker.
    #[arg(long, default_value = "30s")]
    timeout: Duration,
    /// The queue URL the handler is told (x-sqs-queue-url, QC_QUEUE_URL).
    #[arg(long)]
    queue_url: Option<String>,
    /// Cap of the HTTP request head, as --max-request-head of the worker.
    #[arg(long, default_value = "8KiB", value_parser = parse_size)]
    max_request_head: usize,
    #[arg(long, value_name = "URL")]
    http_url: Option<String>,
    #[arg(long, action = ArgAction::SetTrue)]
    exec: bool,
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

fn invoke(args: Vec<std::ffi::OsString>) -> ExitCode {
    let cli = InvokeCli::parse_from(args);
    match invoke_with(&cli) {
        Ok((lines, code)) => {
            for line in lines {
                println!("{line}");
            }
            ExitCode::from(code)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("reading stdin")?;
    Ok(b)
}

/// The bodies of the messages to send: each --body FILE (- for stdin), else stdin (with --batch,
/// one message per non-empty line).
fn invoke_bodies(cli: &InvokeCli) -> anyhow::Result<Vec<Vec<u8>>> {
    if cli.bodies.is_empty() {
        let input = read_stdin()?;
        if !cli.batch {
            return Ok(vec![input]);
        }
        return Ok(input
            .split(|b| *b == b'\n')
            .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect());
    }
    anyhow::ensure!(
        cli.batch || cli.bodies.len() == 1,
        "invalid --body: {} given; several messages go in one call only with --batch",
        cli.bodies.len()
    );
    let mut bodies = Vec::with_capacity(cli.bodies.len());
    let mut stdin_read = false;
    for path in &cli.bodies {
        if path.as_os_str() == "-" {
            anyhow::ensure!(!stdin_read, "invalid --body -: stdin can be read only once");
            stdin_read = true;
            bodies.push(read_stdin()?);
        } else {
            bodies.push(
                std::fs::read(path)
                    .with_context(|| format!("invalid --body: cannot read {}", path.display()))?,
            );
        }
    }
    Ok(bodies)
}

fn invoke_with(cli: &InvokeCli) -> anyhow::Result<(Vec<String>, u8)> {
    use crate::worker::handler::{ExecHandler, Handler, HttpHandler};
    use crate::worker::invoke::{Invocation, MAX_BATCH, default_message_id};
    let mut attributes = Vec::new();
    for a in &cli.attributes {
        let (n, v) = a.split_once('=').with_context(|| {
            format!("invalid --attribute {a:?}: write NAME=VALUE, e.g. --attribute tenant=t-1")
        })?;
        anyhow::ensure!(
            !n.is_empty(),
            "invalid --attribute {a:?}: the name is empty; write NAME=VALUE"
        );
        attributes.push((n.to_string(), v.to_string()));
    }
    let queue = crate::worker::invoke::queue_context(cli.queue_url.as_deref());
    let handler = match (&cli.http_url, cli.exec, cli.command.is_empty()) {
        (Some(url), false, true) => Handler::Http(Box::new(HttpHandler::new(
            url,
            &queue,
            1,
            cli.max_request_head,
        )?)),
        (None, true, false) => Handler::Exec(ExecHandler::new(&cli.command, &queue)?),
        _ => anyhow::bail!(
            "choose one handler: --http-url http://127.0.0.1:8080/messages, or --exec -- COMMAND"
        ),
    };
    let bodies = invoke_bodies(cli)?;
    anyhow::ensure!(
        !bodies.is_empty() && bodies.len() <= MAX_BATCH,
        "invalid --batch: {} messages; a batch holds 1 to {MAX_BATCH} (one per --body FILE, or one per non-empty line of stdin)",
        bodies.len()
    );
    anyhow::ensure!(
        cli.message_ids.is_empty() || cli.message_ids.len() == bodies.len(),
        "invalid --message-id: {} given for {} messages; give one per message, or none",
        cli.message_ids.len(),
        bodies.len()
    );
    let invocations: Vec<Invocation> = bodies
        .into_iter()
        .enumerate()
        .map(|(at, body)| Invocation {
            body,
            attributes: attributes.clone(),
            message_id: cli
                .message_ids
                .get(at)
                .cloned()
                .unwrap_or_else(|| default_message_id(at)),
            receive_count: cli.receive_count,
            group_id: cli.group_id.clone(),
        })
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    if cli.batch {
        return Ok(runtime.block_on(crate::worker::invoke::run_batch(
            &handler,
            &invocations,
            cli.timeout.as_std(),
        )));
    }
    let (line, code) = runtime.block_on(crate::worker::invoke::run(
        &handler,
        &invocations[0],
        cli.timeout.as_std(),
    ));
    Ok((vec![line], code))
}

/// `qc-worker`'s `main`: parses the process's arguments and runs the worker (or `invoke`, or the copy).
pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "invoke") {
        // `qc-worker invoke ...`: the subcommand's own arguments, its name as the program's.
        return invoke(args.into_iter().skip(1).collect());
    }
    let cli = Cli::parse();
    if let Some(to) = &cli.copy_self_to {
        return match copy_self(to) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::FAILURE
            }
        };
    }
    if let Err(e) = crate::telemetry::init_logging(crate::telemetry::LogFormat::Json) {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let config = match config(cli) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "invalid command line");
            eprintln!("error: {e:#}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = check_ssl_cert_file(std::env::var_os("SSL_CERT_FILE")) {
        tracing::error!(error = %e, "invalid environment");
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    let mut config = config;
    config.roots = match crate::roots::Roots::for_this_process() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "invalid CA bundle");
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // One thread: the worker waits on I/O almost all the time, and on one thread its tasks never
    // wake each other across threads (a third fewer CPU per message than 2 worker threads, measured in
    // docs/benchmarks-history.md; one core still handles far more messages than one consumer gets).
    // TOKIO_WORKER_THREADS=N asks for a multi-threaded runtime with N threads instead.
    let mut builder = match worker_threads(std::env::var_os("TOKIO_WORKER_THREADS")) {
        Ok(None) => tokio::runtime::Builder::new_current_thread(),
        Ok(Some(n)) => {
            // Set explicitly, so tokio does not read (and panic on) the variable itself.
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        Err(e) => {
            tracing::error!(error = %e, "invalid environment");
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match builder.enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::worker::run(config, signalled())) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "worker failed");
            eprintln!("error: {e}");
            if matches!(
                e,
                crate::worker::WorkerError::ValidateFlags { .. }
                    | crate::worker::WorkerError::SetUpHandler(_)
                    | crate::worker::WorkerError::StartTracing(_)
            ) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! What the controller renders for the worker container parses with this command line: every
    //! flag `render` writes is one `qc-worker` knows, and each setting arrives with its spec's value.

    use crate::api::{IdempotencyStore, QueueConsumer};
    use crate::manifest::{Document, load_file};
    use crate::render::{self, COPIED_WORKER_BINARY, RenderOptions, WORKER_BINARY};
    use clap::CommandFactory;
    use k8s_openapi::api::core::v1::Container;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    use super::*;

    /// The container that runs `qc-worker` (not the init container that copies it).
    fn worker_container(qc: &QueueConsumer) -> Container {
        let d = render::deployment(qc, &RenderOptions::default()).unwrap();
        let pod = d.spec.template.spec.unwrap();
        pod.containers
            .into_iter()
            .find(|c| {
                c.command.as_deref().is_some_and(|cmd| {
                    cmd.len() == 1 && [WORKER_BINARY, COPIED_WORKER_BINARY].contains(&&*cmd[0])
                })
            })
            .unwrap()
    }

    fn round_trip(qc: &QueueConsumer) {
        let name = qc.metadata.name.clone().unwrap();
        let c = worker_container(qc);
        let mut argv = c.command.clone().unwrap();
        argv.extend(c.args.clone().unwrap());
        let cli = Cli::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("{name}: qc-worker refuses {argv:?}:\n{e}"));
        let mut got = config(cli).unwrap_or_else(|e| panic!("{name}: {argv:?}: {e}"));
        // QC_REDIS_URL comes from a Secret through the environment (checked below); the kubelet's
        // part is played here.
        if c.env.iter().flatten().any(|e| e.name == "QC_REDIS_URL") {
            got.redis_url = Some("redis://from-the-secret:6379/0".into());
        }
        got.validate()
            .unwrap_or_else(|e| panic!("{name}: {argv:?}: {e}"));

        let s = &qc.spec;
        let p = &s.processing;
        let i = &s.idempotency;
        assert_eq!(got.queue_url, s.queue.url, "{name}");
        assert_eq!(got.region, render::region(s), "{name}");
        assert_eq!(got.endpoint_url, s.queue.endpoint, "{name}");
        assert_eq!(
            got.role,
            crate::controller::observe::aws_target(qc).role,
            "{name}: the worker assumes the role the controller does, as the same session"
        );
        assert_eq!(got.concurrency, p.concurrency, "{name}");
        assert_eq!(got.batch_size, p.batch_size, "{name}");
        assert_eq!(got.wait_time, p.wait_time, "{name}");
        assert_eq!(got.timeout, p.timeout, "{name}");
        assert_eq!(got.heartbeat, p.heartbeat.enabled, "{name}");
        assert_eq!(got.heartbeat_interval, p.heartbeat.interval, "{name}");
        assert_eq!(got.retry_base, p.retry_backoff.base, "{name}");
        assert_eq!(got.retry_max, p.retry_backoff.max, "{name}");
        assert_eq!(got.on_poison, p.on_poison, "{name}");
        assert_eq!(got.unwrap_sns, s.handler.unwrap_sns, "{name}");
        let batch = s.handler.batch.clone();
        assert_eq!(
            got.batch_max_items,
            batch.as_ref().map_or(1, |b| b.max_items),
            "{name}"
        );
        if let Some(b) = batch {
            assert_eq!(got.batch_max_wait, b.max_wait, "{name}");
        }
        assert_eq!(got.idempotency_store, i.store, "{name}");
        assert_eq!(got.idempotency_key, i.key, "{name}");
        assert_eq!(got.idempotency_ttl, i.ttl, "{name}");
        assert_eq!(
            got.shutdown_timeout(),
            render::shutdown_timeout(s).as_std(),
            "{name}"
        );
        // The probes reach the worker where it serves them.
        let probe_port = c
            .readiness_probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .map(|g| g.port.clone());
        assert_eq!(
            probe_port.map(|p| format!(
                "0.0.0.0:{}",
                match p {
                    IntOrString::Int(n) => n.to_string(),
                    IntOrString::String(s) => s,
                }
            )),
            Some(got.metrics_addr.clone()),
            "{name}"
        );
        let want = match s.handler.http.as_ref() {
            Some(h) => HandlerConfig::Http {
                url: format!("http://127.0.0.1:{}{}", h.port, h.path),
            },
            None => HandlerConfig::Exec {
                command: s.handler.exec.as_ref().unwrap().command.clone(),
            },
        };
        assert_eq!(got.handler, want, "{name}");
        assert_eq!(
            got.schema_file.as_deref(),
            s.handler
                .schema
                .as_ref()
                .map(|_| std::path::Path::new(crate::render::SCHEMA_FILE)),
            "{name}"
        );
        assert_eq!(
            got.filter,
            s.filter.clone().map(|f| f.patterns).unwrap_or_default(),
            "{name}"
        );
        assert_eq!(
            got.dynamodb
                .as_ref()
                .map(|d| (&d.table, &d.key_attribute, &d.ttl_attribute)),
            i.dynamodb
                .as_ref()
                .filter(|_| i.store == IdempotencyStore::DynamoDb)
                .map(|d| (&d.table, &d.key_attribute, &d.ttl_attribute)),
            "{name}"
        );
        let s3 = s.handler.s3_payloads.clone().unwrap_or_default();
        assert_eq!(got.s3_payloads.is_some(), s3.enabled, "{name}");
        assert_eq!(
            got.s3_payloads.as_ref().is_some_and(|s| s.delete_after),
            s3.enabled && s3.delete_after_processing && s.handler.unwrap_sns == UnwrapSns::Off,
            "{name}"
        );
        let ns = qc.metadata.namespace.as_deref().unwrap_or("default");
        assert_eq!(
            got.s3_payloads.map(|s| s.buckets).unwrap_or_default(),
            if s3.enabled {
                s3.buckets
                    .iter()
                    .map(|b| b.replace("{namespace}", ns))
                    .collect()
            } else {
                Vec::new()
            },
            "{name}: the buckets with the namespace filled in"
        );
        assert_eq!(
            got.exec_pass_aws_credentials,
            s.handler
                .exec
                .as_ref()
                .is_some_and(|e| e.pass_aws_credentials),
            "{name}"
        );

        // The settings rendered as environment variables are ones qc-worker reads.
        let known: Vec<String> = Cli::command()
            .get_arguments()
            .filter_map(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
            .collect();
        for e in c.env.iter().flatten().filter(|e| e.name.starts_with("QC_")) {
            assert!(known.contains(&e.name), "{name}: env {} is no flag", e.name);
        }
        let redis_env = c.env.iter().flatten().any(|e| e.name == "QC_REDIS_URL");
        assert_eq!(redis_env, i.store == IdempotencyStore::Redis, "{name}");
    }

    fn samples() -> Vec<QueueConsumer> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/samples");
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if !path.to_string_lossy().contains("queueconsumer") {
                continue;
            }
            for doc in load_file(&path).unwrap() {
                match doc {
                    Document::Valid(qc) => out.push(*qc),
                    Document::Invalid { name, errors } => panic!("{name}: {errors:?}"),
                    Document::Other { .. } => {}
                }
            }
        }
        out
    }

    #[test]
    fn every_sample_renders_a_command_line_qc_worker_parses() {
        let all = samples();
        assert!(all.len() >= 3, "{}", all.len());
        // A scale-only sample (spec.scaleTargetRef) renders no worker: render refuses it.
        let (worker, scale_only): (Vec<_>, Vec<_>) = all
            .iter()
            .partition(|qc| matches!(qc.spec.mode(), crate::api::Mode::Worker));
        assert!(worker.len() >= 3, "{}", worker.len());
        for qc in worker {
            round_trip(qc);
        }
        for qc in scale_only {
            assert!(render::deployment(qc, &RenderOptions::default()).is_err());
        }
    }

    #[test]
    fn a_spec_with_every_option_set_round_trips() {
        let yaml = r"
apiVersion: sqs.consumers.dev/v1alpha1
kind: QueueConsumer
metadata: {name: everything, namespace: shop}
spec:
  aws: {roleArn: 'arn:aws:iam::000000000000:role/qc-shop-orders'}
  queue:
    url: http://sqs.eu-central-1.localhost.localstack.cloud:4566/000000000000/orders.fifo
    region: eu-west-3
    endpoint: http://localstack:4566
  processing:
    p99: 40s
    mean: 5s
    timeout: 1m30s
    concurrency: 17
    batchSize: 3
    waitTime: 7s
    heartbeat: {enabled: false, interval: 11s}
    retryBackoff: {base: 2s, max: 7m}
    onPoison: delete
    outageTolerance: 45m
  handler:
    http: {port: 8181, path: /hooks/sqs}
    batch: {maxItems: 25, maxWait: 2500ms}
    s3Payloads: {enabled: true, deleteAfterProcessing: true, buckets: ['{namespace}.payloads', shared.*]}
  idempotency:
    store: redis
    key: jsonPointer:/order/id
    ttl: 36h
    redis:
      urlSecretRef: {name: redis, key: url}
  template:
    spec:
      containers: [{name: app, image: example.org/app:1}]
";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("everything.yaml");
        std::fs::write(&path, yaml).unwrap();
        let docs = load_file(&path).unwrap();
        let Some(Document::Valid(qc)) = docs.into_iter().next() else {
            panic!("the spec with every option is not valid");
        };
        round_trip(&qc);
        // Each option differs from qc-worker's default, so a flag dropped by render would show.
        let c = worker_container(&qc);
        let args = c.args.unwrap();
        for flag in [
            "--region",
            "--endpoint-url",
            "--heartbeat",
            "--heartbeat-interval",
            "--on-poison",
            "--idempotency-store",
            "--idempotency-key",
            "--idempotency-ttl",
            "--shutdown-timeout",
        ] {
            assert!(args.iter().any(|a| a == flag), "{flag} missing: {args:?}");
        }
    }
}
