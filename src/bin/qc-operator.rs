//! `qc-operator`: the QueueConsumer controller and its offline tools (argument parsing and wiring only).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    }
}
