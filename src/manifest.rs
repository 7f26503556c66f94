//! Loading QueueConsumer manifests and queue-attribute files for the offline tools (`check`, `plan`,
//! `simulate`): every problem comes back with the file, the document and the field path.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use kube::CustomResourceExt;
use serde_json::Value;

use crate::api::{API_VERSION, GROUP, KIND, QueueConsumer, QueueConsumerSpec};
use crate::aws::{DeadLetterFacts, Facts, FactsError, QueueFacts};

/// One problem with an input, pinned to a field where possible.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// Dotted path, e.g. `spec.processing.p99`; empty when the document as a whole is wrong.
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not valid YAML: {message}")]
    ParseYaml { path: PathBuf, message: String },
    #[error("{path}: not valid JSON: {message}")]
    ParseJson { path: PathBuf, message: String },
    #[error("{path}: {source}")]
    Attributes { path: PathBuf, source: FactsError },
    #[error(
        "{path}: expected the output of `aws sqs get-queue-attributes --attribute-names All` (an object with \"Attributes\")"
    )]
    AttributesShape { path: PathBuf },
}

/// A document of a manifest file.
#[derive(Debug, Clone)]
pub enum Document {
    /// A QueueConsumer that passed the schema and CEL rules.
    Valid(Box<QueueConsumer>),
    /// A QueueConsumer with schema or CEL errors.
    Invalid {
        name: String,
        errors: Vec<FieldError>,
    },
    /// Another kind, skipped.
    Other { kind: String, name: String },
}

/// Read a multi-document YAML file; empty documents are dropped.
pub fn load_file(path: &Path) -> Result<Vec<Document>, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    load_str(&text).map_err(|message| ManifestError::ParseYaml {
        path: path.to_path_buf(),
        message,
    })
}

/// Parse multi-document YAML text into documents (the error is the YAML parser's message).
pub fn load_str(text: &str) -> Result<Vec<Document>, String> {
    let values: Vec<Value> = serde_saphyr::from_multiple(text).map_err(|e| e.to_string())?;
    Ok(values
        .into_iter()
        .filter(|v| !v.is_null())
        .map(classify)
        .collect())
}

fn name_of(v: &Value) -> String {
    let meta = v.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    match meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
    {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn classify(v: Value) -> Document {
    let kind = v
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let api_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let name = name_of(&v);
    let is_ours = api_version.split('/').next() == Some(GROUP);
    if kind != KIND || !is_ours {
        return Document::Other {
            kind: if kind.is_empty() {
                "<no kind>".into()
            } else {
                kind
            },
            name,
        };
    }
    match validate_value(&v) {
        Ok(qc) => Document::Valid(Box::new(qc)),
        Err(errors) => Document::Invalid { name, errors },
    }
}

/// Check a QueueConsumer object as the API server would: version, schema (types, unknown fields,
/// durations), the structural limits, then the CRD's CEL rules.
pub fn validate_value(v: &Value) -> Result<QueueConsumer, Vec<FieldError>> {
    let api_version = v.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if api_version != API_VERSION {
        return Err(vec![FieldError {
            path: "apiVersion".into(),
            message: format!("unsupported version {api_version:?}: use {API_VERSION}"),
        }]);
    }
    let qc: QueueConsumer = match serde_path_to_error::deserialize(v) {
        Ok(qc) => qc,
        Err(e) => {
            let path = e.path().to_string();
            return Err(vec![FieldError {
                path: if path == "." { String::new() } else { path },
                message: e.into_inner().to_string(),
            }]);
        }
    };
    let mut errors = Vec::new();
    if qc.metadata.name.as_deref().unwrap_or("").is_empty() {
        errors.push(FieldError {
            path: "metadata.name".into(),
            message: "required: give the QueueConsumer a name".into(),
        });
    }
    errors.extend(structural_errors(&qc.spec));
    errors.extend(cel_errors(v));
    // What only rendering finds in a given pod template (no handler container, a reserved container or
    // volume name): the controller would hold such a spec with ConfigValid=False, so `check` and `plan`
    // reject it up front. A manifest without a template is left to the rules (CI often lints only those).
    if errors.is_empty()
        && qc.spec.template.spec.is_some()
        && let Err(e) = crate::render::deployment(&qc, &crate::render::RenderOptions::default())
    {
        errors.push(FieldError {
            path: String::new(),
            message: e.to_string(),
        });
    }
    if errors.is_empty() {
        Ok(qc)
    } else {
        Err(errors)
    }
}

/// Schema limits that serde's types do not carry (lengths, minimums, patterns).
fn structural_errors(spec: &QueueConsumerSpec) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut err = |path: &str, message: &str| {
        out.push(FieldError {
            path: path.into(),
            message: message.into(),
        });
    };
    if spec.queue.url.trim().is_empty() {
        err(
            "spec.queue.url",
            "required: the queue URL, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/orders",
        );
    } else if !(spec.queue.url.starts_with("https://") || spec.queue.url.starts_with("http://")) {
        err(
            "spec.queue.url",
            "must be an http(s) queue URL, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/orders",
        );
    }
    if let Some(t) = &spec.scale_target_ref {
        for (path, message) in t.errors() {
            err(path, &message);
        }
    }
    if let Some(h) = &spec.handler.http {
        if h.port == 0 {
            err("spec.handler.http.port", "must be between 1 and 65535");
        }
        if !h.path.starts_with('/') {
            err(
                "spec.handler.http.path",
                "must start with /, e.g. /messages",
            );
        }
    }
    if let Some(e) = &spec.handler.exec
        && (e.command.is_empty() || e.command[0].is_empty())
    {
        err(
            "spec.handler.exec.command",
            "must name a program, e.g. [\"/app/handle\"]",
        );
    }
    for (which, amounts) in [
        ("requests", &spec.worker.resources.requests),
        ("limits", &spec.worker.resources.limits),
    ] {
        for (name, q) in amounts.entries() {
            if !crate::api::is_quantity(&q.0) {
                err(
                    &format!("spec.worker.resources.{which}.{name}"),
                    &format!(
                        "{:?} is not a Kubernetes quantity: write e.g. 50m or 0.5 (cpu), 128Mi (memory)",
                        q.0
                    ),
                );
            }
        }
    }
    if let Some(r) = &spec.idempotency.redis {
        if r.url_secret_ref.name.is_empty() {
            err(
                "spec.idempotency.redis.urlSecretRef.name",
                "required: the Secret's name",
            );
        }
        if r.url_secret_ref.key.is_empty() {
            err(
                "spec.idempotency.redis.urlSecretRef.key",
                "required: the key in the Secret holding the redis URL",
            );
        }
    }
    out
}

/// The CRD's `x-kubernetes-validations`, evaluated client-side (defaults applied first, as the API server does).
fn cel_errors(v: &Value) -> Vec<FieldError> {
    let crd = QueueConsumer::crd();
    let Some(schema) = crd
        .spec
        .versions
        .first()
        .and_then(|ver| ver.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
    else {
        return vec![FieldError {
            path: String::new(),
            message: "internal: the CRD has no schema".into(),
        }];
    };
    let schema = match serde_json::to_value(schema) {
        Ok(s) => s,
        Err(e) => {
            return vec![FieldError {
                path: String::new(),
                message: format!("internal: CRD schema: {e}"),
            }];
        }
    };
    match kube::core::cel::Validator::new().validate(&schema, v, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors
            .into_vec()
            .into_iter()
            .map(|e| FieldError {
                path: e.field_path.clone(),
                message: e.message.clone(),
            })
            .collect(),
    }
}

/// Queue facts from a file holding the JSON that `aws sqs get-queue-attributes --attribute-names All`
/// prints (`{"Attributes": {...}}`; a bare attribute map is accepted too).
pub fn load_attributes(path: &Path, url: &str) -> Result<QueueFacts, ManifestError> {
    let text = std::fs::read_to_string(path).map_err(|source| ManifestError::ReadFile {
        path: path.to_path_buf(),
        source,
    })?;
    let v: Value = serde_json::from_str(&text).map_err(|e| ManifestError::ParseJson {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let map = v.get("Attributes").unwrap_or(&v);
    let Some(obj) = map.as_object() else {
        return Err(ManifestError::AttributesShape {
            path: path.to_path_buf(),
        });
    };
    let attrs: HashMap<String, String> = obj
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_str().map_or_else(|| v.to_string(), str::to_string),
            )
        })
        .collect();
    QueueFacts::from_attributes(url, &attrs).map_err(|source| ManifestError::Attributes {
        path: path.to_path_buf(),
        source,
    })
}

/// Facts from attribute files: the source queue's, and optionally its DLQ's.
pub fn facts_from_files(
    source: &Path,
    dead_letter: Option<&Path>,
    url: &str,
) -> Result<Facts, ManifestError> {
    let queue = load_attributes(source, url)?;
    let dead_letter = match (&queue.redrive, dead_letter) {
        (None, _) => DeadLetterFacts::None,
        (Some(r), None) => DeadLetterFacts::NotRead {
            arn: r.dead_letter_target_arn.clone(),
        },
        // the DLQ's URL is not in its attributes: its ARN identifies it instead
        (Some(r), Some(p)) => DeadLetterFacts::Found {
            queue: load_attributes(p, &r.dead_letter_target_arn)?,
            oldest_age_seconds: None,
        },
    };
    Ok(Facts {
        queue,
        dead_letter,
        oldest_age_seconds: None,
    })
}
