//! `qc-operator check`: the rules run over manifest files, offline or with queue facts, reported for
//! people (text) or machines (JSON). Exit codes: 0 no Error finding, 1 Error findings, 2 bad input.

use std::path::PathBuf;

use serde::Serialize;

use crate::api::{Finding, QueueConsumer, Severity};
use crate::aws::Facts;
use crate::manifest::{self, Document, FieldError};
use crate::validate::{self, Report};

/// Where queue facts come from.
#[derive(Clone, Debug)]
pub enum FactsSource {
    /// No facts: only the rules that need none.
    Offline,
    /// `--attributes FILE [--dlq-attributes FILE]`.
    Files {
        source: PathBuf,
        dead_letter: Option<PathBuf>,
    },
    /// `--live`: read the queue and its DLQ, sending signed requests only to AWS's own endpoints and
    /// to the `spec.queue.endpoint`s these allow (`--allowed-endpoint`, as `run` takes them).
    Live(crate::aws::endpoints::AllowedEndpoints),
}

impl FactsSource {
    /// With `--live`, whether `qc`'s own endpoint may receive this machine's signed requests (key id
    /// and session token): a manifest from elsewhere must not be able to collect them.
    pub fn refuse_endpoint(&self, qc: &QueueConsumer) -> Result<(), String> {
        match (self, &qc.spec.queue.endpoint) {
            (FactsSource::Live(allowed), Some(endpoint)) => allowed.check(endpoint).map_err(|e| {
                format!(
                    "{e}; --live sends signed requests only to AWS and to endpoints allowed with \
                     --allowed-endpoint (e.g. --allowed-endpoint {endpoint})"
                )
            }),
            _ => Ok(()),
        }
    }
}

/// One checked QueueConsumer.
#[derive(Clone, Debug)]
pub struct Checked {
    pub file: String,
    pub name: String,
    pub outcome: Outcome,
    /// With queue facts and `spec.queue.manage` on: what the controller would change on the queue
    /// (a dry run: `check` never changes a queue).
    pub would_change: Vec<String>,
}

#[derive(Clone, Debug)]
pub enum Outcome {
    Report(Report),
    /// Schema or CEL errors (exit 2).
    Invalid(Vec<FieldError>),
    /// Facts could not be had (exit 2).
    NoFacts(String),
}

/// What the whole run produced.
#[derive(Clone, Debug, Default)]
pub struct CheckRun {
    pub checked: Vec<Checked>,
    /// Other kinds skipped: (file, kind, name).
    pub skipped_documents: Vec<(String, String, String)>,
    /// Files that could not be read at all.
    pub file_errors: Vec<String>,
}

impl CheckRun {
    pub fn exit_code(&self) -> u8 {
        let bad_input = !self.file_errors.is_empty()
            || self
                .checked
                .iter()
                .any(|c| !matches!(c.outcome, Outcome::Report(_)))
            || (self.checked.is_empty() && self.skipped_documents.is_empty());
        if bad_input {
            2
        } else {
            u8::from(
                self.checked
                    .iter()
                    .any(|c| matches!(&c.outcome, Outcome::Report(r) if r.has_errors())),
            )
        }
    }
}

/// Reads the facts for one QueueConsumer (the live source does I/O; this keeps `run` testable).
#[async_trait::async_trait]
pub trait FactsReader {
    async fn facts(&self, qc: &QueueConsumer) -> Result<Facts, String>;
}

/// Check every file. `live` is used only with [`FactsSource::Live`].
pub async fn run(
    files: &[PathBuf],
    source: &FactsSource,
    live: Option<&dyn FactsReader>,
) -> CheckRun {
    let mut out = CheckRun::default();
    for path in files {
        let file = path.display().to_string();
        let docs = match manifest::load_file(path) {
            Ok(d) => d,
            Err(e) => {
                out.file_errors.push(e.to_string());
                continue;
            }
        };
        if docs.is_empty() {
            out.file_errors.push(format!("{file}: no YAML documents"));
        }
        for doc in docs {
            match doc {
                Document::Other { kind, name } => {
                    out.skipped_documents.push((file.clone(), kind, name));
                }
                Document::Invalid { name, errors } => out.checked.push(Checked {
                    file: file.clone(),
                    name,
                    outcome: Outcome::Invalid(errors),
                    would_change: Vec::new(),
                }),
                Document::Valid(qc) => {
                    let name = display_name(&qc);
                    let (outcome, would_change) = match facts_for(&qc, source, live).await {
                        Ok(facts) => {
                            let mut report = validate::evaluate(&qc.spec, facts.as_ref());
                            // The queue as it is now, before this spec rolls out: live only.
                            if let (FactsSource::Live(_), Some(f)) = (source, &facts) {
                                report
                                    .findings
                                    .extend(validate::filter_on_backlog(&qc.spec, &f.queue));
                            }
                            (
                                Outcome::Report(report),
                                facts.map(|f| would_change(&qc, &f)).unwrap_or_default(),
                            )
                        }
                        Err(e) => (Outcome::NoFacts(e), Vec::new()),
                    };
                    out.checked.push(Checked {
                        file: file.clone(),
                        name,
                        outcome,
                        would_change,
                    });
                }
            }
        }
    }
    out
}

/// What the controller would change with `spec.queue.manage` on (the same decision, without the
/// other QueueConsumers of the queue, which `check` cannot see).
fn would_change(qc: &QueueConsumer, facts: &Facts) -> Vec<String> {
    if qc.spec.queue.manage.is_off() {
        return Vec::new();
    }
    match crate::manage::decide(&qc.spec, &facts.queue, &[]) {
        crate::manage::Decision::Suspended => {
            vec!["change nothing: spec.suspend is true, so the queue is not touched".to_string()]
        }
        crate::manage::Decision::InSync(_) | crate::manage::Decision::Conflict { .. } => {
            vec![
                "change nothing: the queue's settings are what the rules ask for, or more"
                    .to_string(),
            ]
        }
        crate::manage::Decision::Update(plan) => plan
            .changes
            .iter()
            .map(|c| format!("raise {c} on {}", facts.queue.url))
            .collect(),
    }
}

fn display_name(qc: &QueueConsumer) -> String {
    let name = qc.metadata.name.clone().unwrap_or_default();
    match &qc.metadata.namespace {
        Some(ns) => format!("{ns}/{name}"),
        None => name,
    }
}

async fn facts_for(
    qc: &QueueConsumer,
    source: &FactsSource,
    live: Option<&dyn FactsReader>,
) -> Result<Option<Facts>, String> {
    match source {
        FactsSource::Offline => Ok(None),
        FactsSource::Files {
            source,
            dead_letter,
        } => manifest::facts_from_files(source, dead_letter.as_deref(), &qc.spec.queue.url)
            .map(Some)
            .map_err(|e| e.to_string()),
        FactsSource::Live(_) => match live {
            Some(reader) => {
                source.refuse_endpoint(qc)?;
                reader.facts(qc).await.map(Some)
            }
            None => Err("internal: --live without a queue reader".to_string()),
        },
    }
}

/// The stable JSON shape: one object per finding.
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct JsonFinding<'a> {
    pub file: &'a str,
    pub name: &'a str,
    pub code: &'a str,
    pub severity: Severity,
    pub message: &'a str,
    pub recommendation: &'a str,
}

pub fn json_findings(run: &CheckRun) -> Vec<JsonFinding<'_>> {
    run.checked
        .iter()
        .filter_map(|c| match &c.outcome {
            Outcome::Report(r) => Some((c, r)),
            _ => None,
        })
        .flat_map(|(c, r)| {
            r.findings.iter().map(move |f: &Finding| JsonFinding {
                file: &c.file,
                name: &c.name,
                code: &f.code,
                severity: f.severity,
                message: &f.message,
                recommendation: &f.recommendation,
            })
        })
        .collect()
}

/// Problems that make the input unusable, one line each (for stderr).
pub fn input_errors(run: &CheckRun) -> Vec<String> {
    let mut lines = run.file_errors.clone();
    for c in &run.checked {
        match &c.outcome {
            Outcome::Invalid(errors) => {
                lines.extend(
                    errors
                        .iter()
                        .map(|e| format!("{}: QueueConsumer {}: {e}", c.file, c.name)),
                );
            }
            Outcome::NoFacts(e) => lines.push(format!(
                "{}: QueueConsumer {}: cannot read queue facts: {e}",
                c.file, c.name
            )),
            Outcome::Report(_) => {}
        }
    }
    if run.checked.is_empty() && run.skipped_documents.is_empty() && run.file_errors.is_empty() {
        lines.push("no QueueConsumer found in the given files".to_string());
    }
    lines
}

/// The report for people.
pub fn render_text(run: &CheckRun, source: &FactsSource) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    for (file, kind, name) in &run.skipped_documents {
        let _ = writeln!(s, "{file}: skipped {kind} {name} (not a QueueConsumer)");
    }
    for c in &run.checked {
        let _ = writeln!(s, "{}: QueueConsumer {}", c.file, c.name);
        match &c.outcome {
            Outcome::Invalid(errors) => {
                for e in errors {
                    let _ = writeln!(s, "  invalid  {e}");
                }
            }
            Outcome::NoFacts(e) => {
                let _ = writeln!(s, "  cannot read queue facts: {e}");
            }
            Outcome::Report(r) => {
                let mut findings: Vec<&Finding> = r.findings.iter().collect();
                findings.sort_by_key(|f| std::cmp::Reverse(f.severity));
                if findings.is_empty() {
                    let _ = writeln!(s, "  ok       no findings");
                }
                for f in findings {
                    let _ = writeln!(
                        s,
                        "  {:<8} {}: {}",
                        f.severity.to_string(),
                        f.code,
                        f.message
                    );
                    let _ = writeln!(s, "           fix: {}", f.recommendation);
                }
                for w in &c.would_change {
                    let _ = writeln!(
                        s,
                        "  manage   queue.manage would {w} (dry run: nothing was changed)"
                    );
                }
                if !r.skipped.is_empty() {
                    let (needs, hint) = match source {
                        FactsSource::Offline => (
                            "queue facts",
                            "; use --live or --attributes FILE to run them",
                        ),
                        FactsSource::Files { .. } => (
                            "the dead-letter queue's attributes",
                            "; add --dlq-attributes FILE to run them",
                        ),
                        FactsSource::Live(_) => (
                            "the dead-letter queue's attributes",
                            " (it could not be read)",
                        ),
                    };
                    let codes: Vec<&str> = r.skipped.iter().map(|k| k.code).collect();
                    let _ = writeln!(
                        s,
                        "  skipped  {} rules that need {needs}{hint}: {}",
                        codes.len(),
                        codes.join(", ")
                    );
                }
            }
        }
    }
    let (mut errors, mut warnings) = (0, 0);
    for c in &run.checked {
        if let Outcome::Report(r) = &c.outcome {
            errors += r
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Error)
                .count();
            warnings += r
                .findings
                .iter()
                .filter(|f| f.severity == Severity::Warning)
                .count();
        }
    }
    let invalid = run
        .checked
        .iter()
        .filter(|c| !matches!(c.outcome, Outcome::Report(_)))
        .count();
    let _ = write!(
        s,
        "{} QueueConsumer(s) checked: {errors} error(s), {warnings} warning(s)",
        run.checked.len()
    );
    if invalid > 0 {
        let _ = write!(s, ", {invalid} invalid");
    }
    s.push('\n');
    s
}

/// `--live`: reads the queue and its DLQ through the SQS adapter. Region: `spec.queue.region`, else the
/// one in the queue URL, else the environment; endpoint: `spec.queue.endpoint`, else the SDK's own
/// settings (`AWS_ENDPOINT_URL`); with `spec.aws.roleArn`, as that role (see `facts`).
pub struct LiveFacts;

#[async_trait::async_trait]
impl FactsReader for LiveFacts {
    async fn facts(&self, qc: &QueueConsumer) -> Result<Facts, String> {
        let q = &qc.spec.queue;
        let region = crate::aws::facts::queue_region(q.region.as_deref(), &q.url);
        let mut conf =
            crate::aws::controller_sdk_config(region.as_deref(), q.endpoint.as_deref()).await;
        // As the controller reads it: through `spec.aws.roleArn`, with the session name and the
        // ExternalId (`qc:NAMESPACE`) of the manifest's namespace (`default` when it names none, as
        // `kubectl apply` without -n would), assumed with this machine's credentials.
        if let Some(role) = crate::aws::identity::of_consumer(qc) {
            conf = crate::aws::identity::assume(conf, &role).await;
        }
        let reader = crate::aws::sqs::SqsReader::new(aws_sdk_sqs::Client::new(&conf));
        crate::aws::sqs::observe(&reader, &q.url)
            .await
            .map_err(|e| e.to_string())
    }
}
