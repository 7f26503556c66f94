//! `qc-operator`: the QueueConsumer controller and its offline tools (argument parsing and wiring only).
#![deny(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use qc::scaling::sim::{self, Policy, SimConfig, Trace, report};

#[derive(Parser)]
#[command(
    name = "qc-operator",
    version,
    about = "Run Amazon SQS consumers on Kubernetes declaratively"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the QueueConsumer CustomResourceDefinition as YAML.
    Crd,
    /// Lint QueueConsumer manifests against the rules, offline or with the queue's real settings.
    Check(CheckArgs),
    /// Print the Deployment the controller would apply and the status it would write, without a cluster.
    Plan(PlanArgs),
    /// Run the controller: QueueConsumers become worker Deployments, with status and DLQ health.
    Run(RunArgs),
    /// Replay a traffic trace against the scaling policy, KEDA's SQS scaler and a clairvoyant oracle.
    Simulate(SimulateArgs),
    /// Move a dead-letter queue's messages back to the source queue: through the cluster
    /// (NAMESPACE/NAME: the controller moves them) or directly (--queue-url: moved now, no cluster).
    Redrive(RedriveArgs),
    /// Summarise a dead-letter queue by reason, source queue and age without consuming it: messages
    /// are received with a short visibility and released at once (never deleted); each peek adds one
    /// to their receive count on the DLQ.
    Dlq(DlqArgs),
    /// Turn another autoscaler's objects into QueueConsumers (printed as YAML; nothing is applied).
    #[command(subcommand)]
    Import(ImportCommand),
}

#[derive(Subcommand)]
enum ImportCommand {
    /// KEDA ScaledObjects with aws-sqs-queue triggers (and the TriggerAuthentications they name) as
    /// QueueConsumers in scale-only mode (spec.scaleTargetRef: the controller scales the same workload),
    /// or with --with-worker for the bundled worker. QueueConsumers go to stdout; a line on stderr for
    /// every field that does not carry over. Exit 2, printing nothing, on input that cannot be converted.
    Keda(ImportKedaArgs),
}

#[derive(Args)]
struct ImportKedaArgs {
    /// Files of KEDA objects (multi-document YAML, or a `kind: List` as `kubectl get -o yaml` prints);
    /// `-` reads stdin. TriggerAuthentications a ScaledObject names must be among them.
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,
    /// A QueueConsumer for the bundled worker (handler and template left for you to fill in, one per
    /// queue) instead of scale-only mode.
    #[arg(long)]
    with_worker: bool,
    /// Your consumer's P99 time to handle one message (e.g. 2s); without it processing.p99 is a
    /// placeholder to fill in.
    #[arg(long, value_name = "DURATION", value_parser = nonzero_duration)]
    p99: Option<qc::api::Duration>,
    /// Messages one replica handles at once; default: each trigger's queueLength (KEDA's default 5).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(qc::api::MAX_CONCURRENCY)))]
    concurrency: Option<u32>,
}

#[derive(Args)]
struct DlqArgs {
    /// QueueConsumer as NAMESPACE/NAME: its spec.queue.url (and region) are read from the cluster; the
    /// DLQ is read with your own AWS credentials (spec.queue.endpoint is not used: pass --endpoint-url).
    #[arg(
        value_name = "NAMESPACE/NAME",
        required_unless_present = "queue_url",
        conflicts_with = "queue_url"
    )]
    target: Option<String>,
    /// Source queue URL: summarise the DLQ its redrive policy names.
    #[arg(long, value_name = "URL")]
    queue_url: Option<String>,
    /// SQS endpoint override (local emulators).
    #[arg(long, value_name = "URL")]
    endpoint_url: Option<String>,
    /// AWS region; default: from the URL, else the environment.
    #[arg(long, value_name = "REGION")]
    region: Option<String>,
    /// Peek at most N messages.
    #[arg(long, value_name = "N", default_value_t = qc::aws::triage::DEFAULT_PEEK_MAX, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    max: u64,
    /// Reasons and source queues listed; the rest are summed as (other).
    #[arg(long, value_name = "N", default_value_t = qc::triage::DEFAULT_TOP, value_parser = parse_top)]
    top: usize,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

fn parse_top(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if (1..=100).contains(&n) => Ok(n),
        _ => Err(format!("--top {s:?}: give a whole number from 1 to 100")),
    }
}

#[derive(Args)]
struct RedriveArgs {
    /// QueueConsumer as NAMESPACE/NAME: sets its annotation sqs.consumers.dev/redrive-request to a new
    /// token; follow the move in status.deadLetter.redrive and its Redrive* Events.
    #[arg(
        value_name = "NAMESPACE/NAME",
        required_unless_present = "queue_url",
        conflicts_with = "queue_url"
    )]
    target: Option<String>,
    /// Source queue URL: move the messages of the DLQ its redrive policy names back to it, now.
    #[arg(long, value_name = "URL")]
    queue_url: Option<String>,
    /// SQS endpoint override (local emulators), with --queue-url.
    #[arg(long, value_name = "URL", requires = "queue_url")]
    endpoint_url: Option<String>,
    /// AWS region, with --queue-url; default: from the URL, else the environment.
    #[arg(long, value_name = "REGION", requires = "queue_url")]
    region: Option<String>,
    /// Move at most N messages, with --queue-url; default: twice what the DLQ holds, plus 100.
    #[arg(long, value_name = "N", requires = "queue_url")]
    max: Option<u64>,
    /// Messages moved per second, with --queue-url.
    #[arg(long, value_name = "N", default_value_t = qc::aws::redrive::DEFAULT_RATE, value_parser = clap::value_parser!(u32).range(1..=3000))]
    rate: u32,
    /// Token of this request; default: the current time. The same token never moves twice through the
    /// cluster; with --queue-url it seeds the FIFO deduplication ids.
    #[arg(long, value_name = "TOKEN")]
    token: Option<String>,
    /// Move only messages with this qc-poison-reason, as `qc-operator dlq` prints it ((none): moved
    /// by the redrive policy, no reason attached); repeat for several. With --queue-url.
    #[arg(long = "reason", value_name = "REASON", requires = "queue_url")]
    reasons: Vec<String>,
    /// Move only messages sent at most this long ago (SentTimestamp), e.g. 2h. With --queue-url.
    #[arg(long, value_name = "DURATION", requires = "queue_url")]
    newer_than: Option<qc::api::Duration>,
    /// Move only messages sent at least this long ago (SentTimestamp), e.g. 30m. With --queue-url.
    #[arg(long, value_name = "DURATION", requires = "queue_url")]
    older_than: Option<qc::api::Duration>,
    /// Print what would move (peeking, as `qc-operator dlq` does), move nothing. With --queue-url.
    #[arg(long, requires = "queue_url")]
    dry_run: bool,
}

#[derive(Args)]
struct SimulateArgs {
    /// QueueConsumer manifest whose processing and scaling settings are simulated.
    #[arg(long, value_name = "FILE")]
    spec: PathBuf,
    /// Trace CSV with the header `second,arrivals`; repeat to simulate several traces.
    #[arg(long, required = true, value_name = "FILE")]
    trace: Vec<PathBuf>,
    /// Policy to run; repeat for several (default: ours, keda and oracle).
    #[arg(long, value_enum)]
    policy: Vec<PolicyArg>,
    /// Pod start-up delay: from creation to receiving messages; also the window of
    /// `scaleDownStabilization: auto`, as the controller measures it from the pods.
    #[arg(long, default_value = "30s", value_name = "DURATION")]
    startup: qc::api::Duration,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
    /// Seed of the arrival instants and service times (same seed, same numbers).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// KEDA trigger `queueLength` for the keda policy.
    #[arg(long, default_value_t = 5, value_name = "N")]
    keda_queue_length: u32,
}

#[derive(Clone, Copy, ValueEnum)]
enum PolicyArg {
    Ours,
    Keda,
    Oracle,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Json,
    Text,
}

/// The default of `spec.worker.tracing` (chart values `tracing.*`).
#[derive(Args, Debug, Clone)]
struct WorkerTracingArgs {
    /// Workers export spans unless their spec.worker.tracing.enabled says false (chart value
    /// tracing.workers).
    #[arg(long = "worker-tracing", env = "QC_WORKER_TRACING")]
    enabled: bool,
    /// The collector workers send spans to when their spec names none (chart value tracing.otlp.endpoint).
    #[arg(
        long = "worker-otlp-endpoint",
        env = "QC_WORKER_OTLP_ENDPOINT",
        value_name = "URL"
    )]
    otlp_endpoint: Option<String>,
    /// The share of messages workers trace when their spec names none (chart value tracing.sampling).
    #[arg(
        long = "worker-trace-sampling",
        env = "QC_WORKER_TRACE_SAMPLING",
        value_name = "PERCENT",
        default_value = "1%",
        value_parser = parse_sampling
    )]
    sampling: String,
}

impl WorkerTracingArgs {
    fn defaults(&self) -> qc::render::TracingDefaults {
        qc::render::TracingDefaults {
            enabled: self.enabled,
            endpoint: self.otlp_endpoint.clone().filter(|e| !e.trim().is_empty()),
            sampling: self.sampling.clone(),
        }
    }
}

fn parse_sampling(s: &str) -> Result<String, String> {
    qc::api::sampling_ratio(s).map(|_| s.to_string())
}

#[derive(Args)]
struct RunArgs {
    /// Namespace to watch (repeatable); default: all namespaces.
    #[arg(
        long = "namespace",
        value_name = "NS",
        env = "QC_NAMESPACES",
        value_delimiter = ','
    )]
    namespaces: Vec<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, default_value = "0.0.0.0:8080", value_name = "ADDR")]
    metrics_addr: std::net::SocketAddr,
    /// Elect a leader through a Lease, so that several replicas can run.
    #[arg(long, env = "QC_LEADER_ELECTION")]
    leader_election: bool,
    #[arg(long, default_value = "qc-operator", value_name = "NAME")]
    lease_name: String,
    /// Namespaced mode: the RoleBinding giving this operator its access in each watched namespace, held
    /// with a finalizer while QueueConsumers there hold theirs (the chart sets it; docs/install.md).
    #[arg(long, value_name = "NAME", requires = "namespaces")]
    access_binding: Option<String>,
    /// Namespace of the Lease; default: the pod's own (POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", value_name = "NS")]
    lease_namespace: Option<String>,
    /// How long a leader's claim lasts without renewal (whole seconds); a standby takes over after it.
    #[arg(long, default_value = "15s", value_name = "DURATION")]
    lease_duration: qc::api::Duration,
    /// Image of the worker containers (holds /usr/local/bin/qc-worker).
    #[arg(long, env = "QC_WORKER_IMAGE", value_name = "IMAGE")]
    worker_image: Option<String>,
    #[command(flatten)]
    worker_tracing: WorkerTracingArgs,
    #[arg(long, value_enum, default_value = "json")]
    log_format: LogFormat,
    /// Reconciles run at once by each controller (one per watched namespace, or one for all).
    #[arg(long, default_value_t = qc::controller::run::DEFAULT_RECONCILE_CONCURRENCY, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..))]
    reconcile_concurrency: u16,
    /// One deadline per reconcile: a reconcile still running after this is cancelled and tried again
    /// with backoff (qc_reconcile_errors_total{reason="ReconcileDeadlineExceeded"}).
    #[arg(long, default_value = "2m", value_name = "DURATION", value_parser = nonzero_duration)]
    reconcile_timeout: qc::api::Duration,
    /// Least spec.scaling.pollInterval the controller polls at (chart limits.minPollInterval); a
    /// shorter one runs at this, with a Warning finding. Default: no floor.
    #[arg(long, env = "QC_MIN_POLL_INTERVAL", value_name = "DURATION")]
    min_poll_interval: Option<qc::api::Duration>,
    /// Most replicas per QueueConsumer (chart limits.maxReplicas); a larger spec.scaling.maxReplicas
    /// is clamped, with a Warning finding. Default: no cap.
    #[arg(long, env = "QC_MAX_REPLICAS", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_replicas: Option<u32>,
    /// Most spec.processing.concurrency per 128Mi of the worker container's memory limit (chart
    /// limits.maxConcurrencyPer128Mi); more is clamped, with a Warning finding. Default: no cap.
    #[arg(long = "max-concurrency-per-128mi", env = "QC_MAX_CONCURRENCY_PER_128MI", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_concurrency_per_128mi: Option<u32>,
    /// Most QueueConsumers run in one namespace, the oldest first (chart limits.maxConsumersPerNamespace);
    /// the others get no AWS call and an Error finding. Default: no cap.
    #[arg(long, env = "QC_MAX_CONSUMERS_PER_NAMESPACE", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    max_consumers_per_namespace: Option<u32>,
    /// SQS calls a second the controller allows itself (GetQueueAttributes, GetQueueUrl); throttling
    /// answers lower it for a while.
    #[arg(long, default_value_t = qc::aws::sqs::DEFAULT_LIMIT.rate, value_name = "RATE", value_parser = positive_rate)]
    sqs_requests_per_second: f64,
    /// CloudWatch calls a second the controller allows itself (GetMetricData, DescribeAlarms,
    /// PutMetricAlarm, DeleteAlarms); throttling answers lower it for a while.
    #[arg(long, default_value_t = qc::aws::cloudwatch::DEFAULT_LIMIT.rate, value_name = "RATE", value_parser = positive_rate)]
    cloudwatch_requests_per_second: f64,
    /// AWS calls in flight at once, per service.
    #[arg(long, default_value_t = qc::aws::sqs::DEFAULT_LIMIT.max_in_flight, value_name = "N",
          value_parser = in_flight)]
    aws_max_in_flight: usize,
    /// How long a DLQ alarm's description is reused before CloudWatch is asked again: changes made
    /// by hand are undone, and the alarm's state shows in status, within this.
    #[arg(long, default_value = "5m", value_name = "DURATION")]
    alarm_resync: qc::api::Duration,
    #[command(flatten)]
    endpoints: EndpointArgs,
    /// The tenancy policy, as YAML or JSON: `{rules: [{namespaces: [...], queues: [...], accounts:
    /// [...], roleArns: [...], requireRoleArn: BOOL}]}`. The first rule whose namespaces match decides;
    /// a namespace no rule names gets no AWS call. Default: no rules (everything allowed).
    #[arg(long, env = "QC_TENANCY_POLICY", value_name = "POLICY")]
    tenancy_policy: Option<String>,
}

/// The endpoints a manifest's spec.queue.endpoint may name: `run` and `check`/`plan --live` sign
/// requests with this process's credentials, so they take the same list.
#[derive(Args)]
struct EndpointArgs {
    /// Endpoint a QueueConsumer may name in spec.queue.endpoint, as SCHEME://HOST[:PORT] (`*.` as the
    /// first host label, `*` as the port); repeatable or comma-separated. AWS's own SQS and CloudWatch
    /// endpoints are always allowed; any other endpoint gets no request (run: ConfigValid=False,
    /// EndpointNotAllowed; check and plan --live: exit 2).
    #[arg(
        long = "allowed-endpoint",
        env = "QC_ALLOWED_ENDPOINTS",
        value_delimiter = ',',
        value_name = "PATTERN"
    )]
    allowed_endpoints: Vec<String>,
}

/// A duration greater than zero.
fn nonzero_duration(s: &str) -> Result<qc::api::Duration, String> {
    match s.parse::<qc::api::Duration>() {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("{s:?}: give a duration greater than 0s, e.g. 2m")),
        Err(e) => Err(e.to_string()),
    }
}

/// A rate of calls a second: a positive finite number, at least one a minute.
fn positive_rate(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(r) if r.is_finite() && r >= 1.0 / 60.0 => Ok(r),
        _ => Err(format!(
            "{s:?} is not a rate: give calls a second as a number of at least 0.017 (one a minute), e.g. 5 or 0.5"
        )),
    }
}

fn in_flight(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=1024).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a number of calls in flight: give a whole number from 1 to 1024"
        )),
    }
}

/// Where `check` and `plan` take the queue's attributes from: nowhere (offline), files, or AWS.
#[derive(Args)]
struct FactsArgs {
    /// Read the queue and its dead-letter queue (region from the URL or spec.queue.region; endpoint from
    /// spec.queue.endpoint or AWS_ENDPOINT_URL; credentials from the default chain; with spec.aws.roleArn
    /// that role, assumed with those credentials and the ExternalId qc:NAMESPACE of the manifest's
    /// namespace, `default` when it names none). `plan` also reads the DLQ's oldest-message age, as the
    /// controller does.
    #[arg(long, conflicts_with = "attributes")]
    live: bool,
    // With --live: the same list as `run --allowed-endpoint`.
    #[command(flatten)]
    endpoints: EndpointArgs,
    /// JSON printed by `aws sqs get-queue-attributes --attribute-names All` for the source queue.
    #[arg(long, value_name = "FILE")]
    attributes: Option<PathBuf>,
    /// The same JSON for the dead-letter queue (with --attributes).
    #[arg(long, value_name = "FILE", requires = "attributes")]
    dlq_attributes: Option<PathBuf>,
}

impl FactsArgs {
    fn source(&self) -> anyhow::Result<qc::check::FactsSource> {
        use qc::check::FactsSource;
        Ok(match (&self.attributes, self.live) {
            (Some(a), _) => FactsSource::Files {
                source: a.clone(),
                dead_letter: self.dlq_attributes.clone(),
            },
            (None, true) => FactsSource::Live(
                qc::aws::endpoints::AllowedEndpoints::parse(&self.endpoints.allowed_endpoints)
                    .map_err(|e| anyhow::anyhow!("--allowed-endpoint: {e}"))?,
            ),
            (None, false) => FactsSource::Offline,
        })
    }
}

#[derive(Args)]
struct PlanArgs {
    /// Manifest file with QueueConsumers (multi-document YAML; other kinds are skipped).
    file: PathBuf,
    #[command(flatten)]
    facts: FactsArgs,
    /// Image of the worker container, as `run --worker-image`.
    #[arg(long, env = "QC_WORKER_IMAGE", value_name = "IMAGE")]
    worker_image: Option<String>,
    #[command(flatten)]
    worker_tracing: WorkerTracingArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Args)]
struct CheckArgs {
    /// Manifest files (multi-document YAML; other kinds are skipped).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    #[command(flatten)]
    facts: FactsArgs,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

/// The worker's allocator ([`qc::worker::cli`] runs in this process when it is started as `qc-worker`):
/// mimalloc, for the controller too, so one binary serves both.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Whether this process was started under the worker's name: the image holds one binary under both
/// names (`/usr/local/bin/qc-worker` links to `qc-operator`), and the exec layout's copy is named
/// `qc-worker` too.
fn started_as_worker(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .and_then(|a| Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("qc-worker"))
}

fn main() -> ExitCode {
    if started_as_worker(std::env::args_os().next().as_deref()) {
        return qc::worker::cli::main();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => match qc::api::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot render the CRD: {e}");
                ExitCode::from(2)
            }
        },
        Command::Check(args) => check(args),
        Command::Plan(args) => plan(args),
        Command::Simulate(args) => match simulate(&args) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Redrive(args) => redrive(args),
        Command::Dlq(args) => dlq(args),
        Command::Import(ImportCommand::Keda(args)) => import_keda(&args),
        Command::Run(args) => match run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                // The context says what failed, the error under it why; kube's errors already carry
                // their sources in their own text, so the full chain would repeat them.
                let message = match e.chain().nth(1) {
                    Some(cause) => format!("{e}: {cause}"),
                    None => e.to_string(),
                };
                tracing::error!(error = %message, "qc-operator stopped");
                eprintln!("error: {message}");
                ExitCode::FAILURE
            }
        },
    }
}

impl From<LogFormat> for qc::telemetry::LogFormat {
    fn from(f: LogFormat) -> Self {
        match f {
            LogFormat::Json => qc::telemetry::LogFormat::Json,
            LogFormat::Text => qc::telemetry::LogFormat::Text,
        }
    }
}

/// The pod name (POD_NAME) is the identity in the Lease; outside a pod, host and process id.
fn identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| {
            let host = std::env::var("HOSTNAME")
                .ok()
                .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
                .map(|h| h.trim().to_string())
                .filter(|h| !h.is_empty())
                .unwrap_or_else(|| "qc-operator".to_string());
            format!("{host}-{}", std::process::id())
        })
}

fn run(args: RunArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use qc::controller::run::{LeaderOptions, RunOptions};
    qc::telemetry::init_logging(args.log_format.into())?;
    // Two rustls crypto providers are compiled in (kube's and the AWS SDK's) and rustls then picks
    // none by itself: without this the first TLS connection to the API server panics. Already
    // installed is fine.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let identity = identity();
    let leader = if args.leader_election {
        let lease_namespace = args.lease_namespace.clone().context(
            "--leader-election needs --lease-namespace or POD_NAMESPACE (the chart sets it from the downward API)",
        )?;
        let lease_seconds = args.lease_duration.as_secs_ceil().max(2);
        Some(LeaderOptions {
            lease_name: args.lease_name.clone(),
            lease_namespace,
            identity: identity.clone(),
            lease_seconds,
            // Renew a third of the way before expiry.
            grace_seconds: (lease_seconds / 3).max(1),
        })
    } else {
        None
    };
    let opts = RunOptions {
        namespaces: args
            .namespaces
            .into_iter()
            .filter(|n| !n.is_empty())
            .collect(),
        metrics_addr: args.metrics_addr,
        leader,
        reconcile_concurrency: args.reconcile_concurrency,
    };
    let defaults = qc::controller::observe::AwsOptions::default();
    let aws = qc::controller::observe::AwsOptions {
        sqs: qc::aws::limit::LimitConfig::new(args.sqs_requests_per_second, args.aws_max_in_flight),
        cloudwatch: qc::aws::limit::LimitConfig::new(
            args.cloudwatch_requests_per_second,
            args.aws_max_in_flight,
        ),
        batch: qc::aws::cloudwatch::BatchOptions {
            alarm_max_age: args.alarm_resync.as_std(),
            ..defaults.batch
        },
    };
    // A bad pattern stops the controller at start-up, naming it, rather than refusing every endpoint later.
    let allowed_endpoints =
        qc::aws::endpoints::AllowedEndpoints::parse(&args.endpoints.allowed_endpoints)
            .context("--allowed-endpoint (chart value aws.allowedEndpoints)")?;
    let tenancy = qc::tenancy::TenancyPolicy::parse(args.tenancy_policy.as_deref().unwrap_or(""))
        .context("--tenancy-policy (chart value tenancy)")?;
    let limits = qc::validate::limits::AdminLimits {
        min_poll_interval: args.min_poll_interval,
        max_replicas: args.max_replicas,
        max_concurrency_per_128mi: args.max_concurrency_per_128mi,
        max_consumers_per_namespace: args.max_consumers_per_namespace,
    };
    let reconcile_timeout = args.reconcile_timeout.as_std();
    let access_binding = args.access_binding.clone();
    let render = qc::render::RenderOptions {
        worker_image: args
            .worker_image
            .unwrap_or_else(qc::render::default_worker_image),
        tracing: args.worker_tracing.defaults(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    rt.block_on(async move {
        let client = qc::controller::client::client().await?;
        let mut ctx = qc::controller::Context::new(
            client,
            std::sync::Arc::new(qc::controller::observe::SdkProvider::new(aws)),
            render,
            Some(identity),
        );
        ctx.endpoints = allowed_endpoints;
        ctx.tenancy = tenancy;
        ctx.limits = limits;
        ctx.reconcile_timeout = reconcile_timeout;
        ctx.access = access_binding
            .map(|name| qc::controller::access::AccessBinding::new(ctx.client.clone(), name));
        // OTEL_EXPORTER_OTLP_ENDPOINT (chart value tracing.otlp.endpoint): a trace per reconcile.
        let otlp = qc::telemetry::otlp::Otlp::from_env("qc-operator")
            .context("tracing (chart values tracing.*)")?;
        if let Some(o) = &otlp {
            let s = o.settings();
            tracing::info!(endpoint = %s.traces_url, sampler = ?s.sampling, "exporting spans over OTLP");
            ctx.tracer = Some(o.tracer());
        }
        let ctx = std::sync::Arc::new(ctx);
        let result = qc::controller::run::run(ctx, opts, shutdown_signal())
            .await
            .map_err(anyhow::Error::from);
        if let Some(o) = otlp {
            o.shutdown().await;
        }
        result
    })
}

/// SIGTERM (the kubelet) or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {},
                _ = ctrl_c => {},
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
    tracing::info!("shutting down");
}

fn plan(args: PlanArgs) -> ExitCode {
    let source = match args.facts.source() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = qc::render::RenderOptions {
        worker_image: args
            .worker_image
            .unwrap_or_else(qc::render::default_worker_image),
        tracing: args.worker_tracing.defaults(),
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let run = rt.block_on(qc::controller::plan::run_file(&args.file, &source, &opts));
    for e in &run.errors {
        eprintln!("error: {e}");
    }
    print!("{}", run.output);
    ExitCode::from(run.exit_code)
}

fn read(path: &Path) -> anyhow::Result<String> {
    use anyhow::Context as _;
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn simulate(args: &SimulateArgs) -> anyhow::Result<String> {
    use anyhow::Context as _;
    let spec =
        sim::load_spec(&read(&args.spec)?).with_context(|| args.spec.display().to_string())?;
    let mut cfg = SimConfig::from_spec(&spec, args.startup, args.seed);
    cfg.keda.queue_length = args.keda_queue_length.max(1);
    let policies: Vec<Policy> = if args.policy.is_empty() {
        Policy::ALL.to_vec()
    } else {
        args.policy
            .iter()
            .map(|p| match p {
                PolicyArg::Ours => Policy::Ours,
                PolicyArg::Keda => Policy::Keda,
                PolicyArg::Oracle => Policy::Oracle,
            })
            .collect()
    };
    let mut results = Vec::new();
    for path in &args.trace {
        let trace = Trace::parse(&read(path)?).with_context(|| path.display().to_string())?;
        let name = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        results.push(sim::run_trace(&cfg, &name, &trace, &policies));
    }
    Ok(match args.output {
        Output::Text => report::text(&cfg, &results),
        Output::Json => report::json(&results)? + "\n",
    })
}

fn redrive(args: RedriveArgs) -> ExitCode {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let token = args
        .token
        .clone()
        .unwrap_or_else(|| k8s_openapi::jiff::Timestamp::now().to_string());
    if let Some(url) = &args.queue_url {
        let select = qc::triage::Selector {
            reasons: args.reasons.clone(),
            newer_than: args.newer_than.map(|d| d.as_std()),
            older_than: args.older_than.map(|d| d.as_std()),
            transient_only: false,
        };
        if let Err(e) = select.validate() {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        let region = qc::aws::facts::queue_region(args.region.as_deref(), url);
        if args.dry_run {
            let result = rt.block_on(async {
                let conf =
                    qc::aws::sdk_config(region.as_deref(), args.endpoint_url.as_deref()).await;
                let client = qc::aws::operator_sqs(aws_sdk_sqs::Client::new(&conf));
                let max = args.max.unwrap_or(qc::aws::triage::DEFAULT_PEEK_MAX);
                qc::aws::triage::dry_run(&client, url, max, &select).await
            });
            return match result {
                Ok(d) => {
                    print!("{}", render_dry_run(&d, qc::aws::redrive::now_ms()));
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            };
        }
        let result = rt.block_on(async {
            let conf = qc::aws::sdk_config(region.as_deref(), args.endpoint_url.as_deref()).await;
            let client = qc::aws::operator_sqs(aws_sdk_sqs::Client::new(&conf));
            qc::aws::redrive::redrive_selected(&client, url, args.max, args.rate, &token, &select)
                .await
        });
        return match result {
            Ok(done) => {
                let skipped = if done.skipped > 0 {
                    format!(
                        " ({} message(s) of other source queues left in it)",
                        done.skipped
                    )
                } else {
                    String::new()
                };
                let not_selected = if done.not_selected > 0 {
                    format!(
                        " ({} message(s) not selected left in it)",
                        done.not_selected
                    )
                } else {
                    String::new()
                };
                println!(
                    "moved {} message(s) from {} to {}{skipped}{not_selected}",
                    done.moved, done.route.dlq_url, done.route.source_url
                );
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        };
    }
    // clap's `requires` is not enforced next to the positional's `conflicts_with`: say it here.
    let direct_only = [
        (!args.reasons.is_empty(), "--reason"),
        (args.newer_than.is_some(), "--newer-than"),
        (args.older_than.is_some(), "--older-than"),
        (args.dry_run, "--dry-run"),
        (args.max.is_some(), "--max"),
        (args.endpoint_url.is_some(), "--endpoint-url"),
        (args.region.is_some(), "--region"),
    ];
    if let Some((_, flag)) = direct_only.iter().find(|(given, _)| *given) {
        eprintln!(
            "error: {flag} works with --queue-url only (the move runs here, now); through the cluster (NAMESPACE/NAME) the controller moves the whole DLQ: use --queue-url URL with the QueueConsumer's spec.queue.url"
        );
        return ExitCode::from(2);
    }
    let target = args.target.unwrap_or_default();
    let Some((ns, name)) = target
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
    else {
        eprintln!(
            "error: {target:?} is not NAMESPACE/NAME (e.g. shop/orders), or use --queue-url URL"
        );
        return ExitCode::from(2);
    };
    let result = rt.block_on(async {
        let client = qc::controller::client::client()
            .await
            .map_err(|e| kube::Error::Service(Box::new(e)))?;
        qc::controller::redrive::request(client, ns, name, &token).await
    });
    match result {
        Ok(()) => {
            println!(
                "redrive {token:?} requested for QueueConsumer {ns}/{name}; follow it with: kubectl get qc {name} -n {ns} -o jsonpath='{{.status.deadLetter.redrive}}'"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot annotate QueueConsumer {ns}/{name}: {e}");
            ExitCode::from(1)
        }
    }
}

fn age(secs: Option<u64>) -> String {
    match secs {
        None => "-".to_string(),
        Some(s) if s < 120 => format!("{s}s"),
        Some(s) if s < 7200 => format!("{}m", s / 60),
        Some(s) if s < 172_800 => format!("{}h", s / 3600),
        Some(s) => format!("{}d", s / 86_400),
    }
}

fn render_dry_run(d: &qc::aws::triage::DryRun, now_ms: u64) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "dry run: would move {} message(s) from {} to {}; {} of this queue not selected, {} of other source queues; nothing moved\n",
        d.would_move.len(),
        d.route.dlq_url,
        d.route.source_url,
        d.not_selected,
        d.other_sources
    );
    for p in &d.would_move {
        let a = age(p.sent_at_ms.map(|s| now_ms.saturating_sub(s) / 1000));
        let _ = writeln!(out, "  {}  age {a}  reason {}", p.id, p.reason);
    }
    if !d.complete {
        out.push_str(
            "(peek bounded by --max or its time budget: more messages may be in the DLQ)\n",
        );
    }
    if d.not_released > 0 {
        let _ = writeln!(
            out,
            "{} peeked message(s) could not be released; they are visible again within {}s",
            d.not_released,
            qc::aws::triage::PEEK_VISIBILITY_SECS
        );
    }
    out
}

fn render_summary(
    route: &qc::aws::redrive::Route,
    peek: &qc::aws::triage::Peek,
    s: &qc::triage::Summary,
) -> String {
    use std::fmt::Write;
    let mut out = format!(
        "dead-letter queue {} (of {}): {} message(s) peeked{}\n",
        route.dlq_url,
        route.source_url,
        s.total,
        if peek.complete {
            ""
        } else {
            " (bounded by --max or the peek's time budget: more may be in it)"
        }
    );
    out.push_str("\nby reason (qc-poison-reason):\n");
    for c in &s.by_reason {
        let _ = writeln!(
            out,
            "  {:>6}  oldest {:>5}  {}",
            c.count,
            age(c.oldest_age_seconds),
            c.key
        );
    }
    out.push_str("\nby source queue:\n");
    for c in &s.by_source {
        let _ = writeln!(
            out,
            "  {:>6}  oldest {:>5}  {}",
            c.count,
            age(c.oldest_age_seconds),
            c.key
        );
    }
    let a = &s.ages;
    let _ = writeln!(
        out,
        "\nby age (since SentTimestamp): <1h {}  <1d {}  <7d {}  older {}  unknown {}",
        a.under_1h, a.under_1d, a.under_7d, a.older, a.unknown
    );
    out.push_str("\nnothing was consumed: every peeked message was made visible again (ChangeMessageVisibility 0); each peek adds 1 to their receive count on the DLQ\n");
    if let Some(n) = route.dlq_max_receive_count {
        let _ = writeln!(
            out,
            "warning: the DLQ has a redrive policy of its own (maxReceiveCount {n}): a message peeked that often moves on to its dead-letter queue"
        );
    }
    if peek.not_released > 0 {
        let _ = writeln!(
            out,
            "{} peeked message(s) could not be released; they are visible again within {}s",
            peek.not_released,
            qc::aws::triage::PEEK_VISIBILITY_SECS
        );
    }
    out
}

fn dlq(args: DlqArgs) -> ExitCode {
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let (url, region) = match (&args.queue_url, &args.target) {
        (Some(url), _) => (url.clone(), args.region.clone()),
        (None, target) => {
            let target = target.clone().unwrap_or_default();
            let Some((ns, name)) = target
                .split_once('/')
                .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
            else {
                eprintln!(
                    "error: {target:?} is not NAMESPACE/NAME (e.g. shop/orders), or use --queue-url URL"
                );
                return ExitCode::from(2);
            };
            let found = rt.block_on(async {
                let client = qc::controller::client::client()
                    .await
                    .map_err(|e| kube::Error::Service(Box::new(e)))?;
                qc::controller::redrive::queue_of(client, ns, name).await
            });
            match found {
                Ok((url, region)) => (url, args.region.clone().or(region)),
                Err(e) => {
                    eprintln!("error: cannot read QueueConsumer {ns}/{name}: {e}");
                    return ExitCode::from(1);
                }
            }
        }
    };
    let region = qc::aws::facts::queue_region(region.as_deref(), &url);
    let result = rt.block_on(async {
        let conf = qc::aws::sdk_config(region.as_deref(), args.endpoint_url.as_deref()).await;
        let client = qc::aws::operator_sqs(aws_sdk_sqs::Client::new(&conf));
        qc::aws::triage::peek_source(&client, &url, args.max).await
    });
    let (route, peek) = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let summary = qc::triage::summarise(&peek.messages, qc::aws::redrive::now_ms(), args.top);
    match args.output {
        Output::Text => print!("{}", render_summary(&route, &peek, &summary)),
        Output::Json => {
            let doc = serde_json::json!({
                "deadLetterQueue": route.dlq_url,
                "sourceQueue": route.source_url,
                "complete": peek.complete,
                "notReleased": peek.not_released,
                "deadLetterMaxReceiveCount": route.dlq_max_receive_count,
                "summary": summary,
            });
            match serde_json::to_string_pretty(&doc) {
                Ok(j) => println!("{j}"),
                Err(e) => {
                    eprintln!("error: cannot encode the summary: {e}");
                    return ExitCode::from(2);
                }
            }
        }
    }
    ExitCode::SUCCESS
}

/// Read every file (`-`: stdin, once), convert, and print only when everything converted.
fn import_keda(args: &ImportKedaArgs) -> ExitCode {
    use qc::import::keda;
    use std::io::Read as _;
    let mut inputs = Vec::new();
    let mut unreadable = false;
    let mut stdin_read = false;
    for path in &args.files {
        let (file, text) = if path.as_os_str() == "-" {
            let mut text = String::new();
            if stdin_read {
                eprintln!("error: -: stdin can be read once: give - a single time");
                unreadable = true;
                continue;
            }
            stdin_read = true;
            if let Err(e) = std::io::stdin().read_to_string(&mut text) {
                eprintln!("error: -: cannot read stdin: {e}");
                unreadable = true;
                continue;
            }
            ("(stdin)".to_string(), text)
        } else {
            match std::fs::read_to_string(path) {
                Ok(text) => (path.display().to_string(), text),
                Err(e) => {
                    eprintln!(
                        "error: {}: cannot read it: {e}: give the path of a file of KEDA objects, or - for stdin",
                        path.display()
                    );
                    unreadable = true;
                    continue;
                }
            }
        };
        inputs.push(keda::Input { file, text });
    }
    if unreadable {
        return ExitCode::from(2);
    }
    let opts = keda::Options {
        with_worker: args.with_worker,
        p99: args.p99,
        concurrency: args.concurrency,
    };
    let report = keda::import(&inputs, &opts);
    for note in &report.notes {
        eprintln!("{}: {note}", if note.todo { "todo" } else { "note" });
    }
    if !report.errors.is_empty() {
        for e in &report.errors {
            eprintln!("error: {e}");
        }
        eprintln!("nothing printed: fix the input above and import again");
        return ExitCode::from(2);
    }
    let mut out = String::new();
    for qc in &report.consumers {
        out.push_str("---\n");
        out.push_str(&qc.yaml);
        if !qc.todos.is_empty() {
            eprintln!(
                "warning: QueueConsumer {} (from {}) cannot be applied as it is: fill in {} (the todo lines above; {} in its YAML)",
                qc.name(),
                qc.source,
                qc.todos.join(", "),
                keda::TODO
            );
        }
    }
    print!("{out}");
    eprintln!(
        "imported {} QueueConsumer(s) from {} ScaledObject(s){}",
        report.consumers.len(),
        report.scaled_objects,
        if report.other_documents > 0 {
            format!(
                "; {} document(s) of other kinds not read",
                report.other_documents
            )
        } else {
            String::new()
        }
    );
    ExitCode::SUCCESS
}

fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("error: cannot start the async runtime: {e}");
            ExitCode::from(2)
        })
}

fn check(args: CheckArgs) -> ExitCode {
    use qc::check;
    let source = match args.facts.source() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let run = rt.block_on(check::run(&args.files, &source, Some(&check::LiveFacts)));
    match args.output {
        Output::Text => {
            // invalid documents are shown inline; only unreadable files go to stderr
            for line in &run.file_errors {
                eprintln!("error: {line}");
            }
            print!("{}", check::render_text(&run, &source));
        }
        Output::Json => match serde_json::to_string_pretty(&check::json_findings(&run)) {
            Ok(json) => {
                for line in check::input_errors(&run) {
                    eprintln!("error: {line}");
                }
                println!("{json}");
            }
            Err(e) => {
                eprintln!("error: cannot encode findings: {e}");
                return ExitCode::from(2);
            }
        },
    }
    ExitCode::from(run.exit_code())
}
