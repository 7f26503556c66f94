//! `qc-operator`: the QueueConsumer controller and its offline tools (argument parsing and wiring only).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
}

#[derive(Args)]
struct PlanArgs {
    /// Manifest file with QueueConsumers (multi-document YAML; other kinds are skipped).
    file: PathBuf,
    /// Read the queue, its dead-letter queue and the DLQ's oldest-message age (as the controller does).
    #[arg(long, conflicts_with = "attributes")]
    live: bool,
    /// JSON printed by `aws sqs get-queue-attributes --attribute-names All` for the source queue.
    #[arg(long, value_name = "FILE")]
    attributes: Option<PathBuf>,
    /// The same JSON for the dead-letter queue (with --attributes).
    #[arg(long, value_name = "FILE", requires = "attributes")]
    dlq_attributes: Option<PathBuf>,
    /// Image of the worker container, as `run --worker-image`.
    #[arg(long, env = "QC_WORKER_IMAGE", value_name = "IMAGE")]
    worker_image: Option<String>,
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
    /// Read the queue and its dead-letter queue (region from the URL or spec.queue.region; endpoint from
    /// spec.queue.endpoint or AWS_ENDPOINT_URL; credentials from the default chain).
    #[arg(long, conflicts_with = "attributes")]
    live: bool,
    /// JSON printed by `aws sqs get-queue-attributes --attribute-names All` for the source queue.
    #[arg(long, value_name = "FILE")]
    attributes: Option<PathBuf>,
    /// The same JSON for the dead-letter queue (with --attributes).
    #[arg(long, value_name = "FILE", requires = "attributes")]
    dlq_attributes: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "text")]
    output: Output,
}

fn main() -> ExitCode {
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
    }
}

fn plan(args: PlanArgs) -> ExitCode {
    use qc::check::FactsSource;
    let source = match (&args.attributes, args.live) {
        (Some(a), _) => FactsSource::Files {
            source: a.clone(),
            dead_letter: args.dlq_attributes.clone(),
        },
        (None, true) => FactsSource::Live,
        (None, false) => FactsSource::Offline,
    };
    let opts = qc::render::RenderOptions {
        worker_image: args
            .worker_image
            .unwrap_or_else(qc::render::default_worker_image),
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
    use qc::check::{self, FactsSource};
    let source = match (&args.attributes, args.live) {
        (Some(a), _) => FactsSource::Files {
            source: a.clone(),
            dead_letter: args.dlq_attributes.clone(),
        },
        (None, true) => FactsSource::Live,
        (None, false) => FactsSource::Offline,
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
