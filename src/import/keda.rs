//! `qc-operator import keda`: KEDA ScaledObjects with `aws-sqs-queue` triggers, and the
//! TriggerAuthentications they name, become QueueConsumers; every field that does not carry over is a
//! note naming the ScaledObject, the field, why and what to do.
//!
//! Pure: text in, QueueConsumers (as printed, parsed back and validated) and notes out. What KEDA's
//! fields mean is taken from KEDA's documentation (keda-docs: `reference/scaledobject-spec.md`,
//! `scalers/aws-sqs.md`, `authentication-providers/aws.md`) and its source (`pkg/scalers/
//! aws_sqs_queue_scaler.go`, `pkg/scalers/aws/aws_common.go`, `apis/keda/v1alpha1`).

use std::collections::BTreeSet;
use std::fmt;

use serde_json::{Map, Value};

use super::yaml::Node;
use crate::api::{self, API_VERSION, Duration, KIND, Mode, QueueConsumer};
use crate::manifest::{self, Document};

/// KEDA's API group.
pub const KEDA_GROUP: &str = "keda.sh";
/// The trigger this import reads.
pub const SQS_TRIGGER: &str = "aws-sqs-queue";
/// KEDA's `queueLength` when a trigger leaves it out (scalers/aws-sqs.md).
pub const KEDA_DEFAULT_QUEUE_LENGTH: u32 = 5;
/// KEDA's `maxReplicaCount` when a ScaledObject leaves it out (reference/scaledobject-spec.md).
pub const KEDA_DEFAULT_MAX_REPLICAS: u32 = 100;
/// `processing.p99` written when no `--p99` is given; `scaling.maxBacklogAge` is set to the same, which
/// counts every visible message as one slot, as KEDA's `queueLength` does.
pub const PLACEHOLDER_P99: Duration = Duration::from_secs(30);
/// The marker of everything the user must fill in before applying.
pub const TODO: &str = "TODO(import)";

const PAUSED: &str = "autoscaling.keda.sh/paused";
const PAUSED_REPLICAS: &str = "autoscaling.keda.sh/paused-replicas";

/// One input file's text.
#[derive(Clone, Debug)]
pub struct Input {
    /// The name errors and notes give it (`-` is read as stdin and named so).
    pub file: String,
    pub text: String,
}

/// What the command line chose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// A QueueConsumer for the bundled worker (handler, template to fill in) instead of scale-only mode.
    pub with_worker: bool,
    /// The consumer's declared P99 (`--p99`); without it `processing.p99` is a placeholder.
    pub p99: Option<Duration>,
    /// Messages one replica handles at once (`--concurrency`); without it, each trigger's `queueLength`.
    pub concurrency: Option<u32>,
}

/// Where an object is: file, document (from 1) and, in a `kind: List`, its item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    pub file: String,
    pub document: usize,
    pub item: Option<usize>,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, document {}", self.file, self.document)?;
        if let Some(i) = self.item {
            write!(f, ", items[{i}]")?;
        }
        Ok(())
    }
}

/// Input the import cannot convert (exit 2): where, which field, what is wrong and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImportError {
    /// File and document, and the object when it is known.
    pub at: String,
    /// The field's path in that object; empty for the file or document as a whole.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}: {}", self.at, self.message)
        } else {
            write!(f, "{}: {}: {}", self.at, self.field, self.message)
        }
    }
}

/// A field that did not carry over as it was (or at all), or a ScaledObject skipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// File, document and the ScaledObject.
    pub at: String,
    /// The ScaledObject's field (or the TriggerAuthentication's, named so).
    pub field: String,
    /// Why, and what to do.
    pub message: String,
    /// The printed QueueConsumer needs a change before it is applied (its YAML says `TODO(import)`).
    pub todo: bool,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.at, self.field, self.message)
    }
}

/// One QueueConsumer, as printed.
#[derive(Clone, Debug)]
pub struct Imported {
    /// `ScaledObject NAMESPACE/NAME` it was made from.
    pub source: String,
    pub origin: Origin,
    /// The YAML document (comments included), parsed back and validated as `consumer`.
    pub yaml: String,
    pub consumer: QueueConsumer,
    /// Fields to fill in before it is applied (empty: it can be applied as it is).
    pub todos: Vec<String>,
}

impl Imported {
    /// `NAMESPACE/NAME` (or `NAME`) of the QueueConsumer.
    pub fn name(&self) -> String {
        let name = self.consumer.metadata.name.clone().unwrap_or_default();
        match &self.consumer.metadata.namespace {
            Some(ns) => format!("{ns}/{name}"),
            None => name,
        }
    }
}

/// Everything one run produced.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Empty when `errors` is not: a partial set would be applied as if it were whole.
    pub consumers: Vec<Imported>,
    /// Input that cannot be converted (exit 2).
    pub errors: Vec<ImportError>,
    /// In input order: notes, TODOs and skipped ScaledObjects.
    pub notes: Vec<Note>,
    pub scaled_objects: usize,
    /// Documents of other kinds (Deployments, Secrets...), not read.
    pub other_documents: usize,
}

/// A Kubernetes object of the input.
#[derive(Clone, Debug)]
struct Object {
    origin: Origin,
    kind: String,
    group: String,
    name: Option<String>,
    namespace: Option<String>,
    value: Value,
}

impl Object {
    fn from_value(origin: Origin, value: Value) -> Object {
        let text = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
        let kind = text(value.get("kind")).unwrap_or_default();
        let api_version = text(value.get("apiVersion")).unwrap_or_default();
        let group = match api_version.split_once('/') {
            Some((g, _)) => g.to_string(),
            None => String::new(),
        };
        let meta = value.get("metadata");
        let name = text(meta.and_then(|m| m.get("name"))).filter(|n| !n.is_empty());
        let namespace = text(meta.and_then(|m| m.get("namespace"))).filter(|n| !n.is_empty());
        Object {
            origin,
            kind,
            group,
            name,
            namespace,
            value,
        }
    }

    fn is_keda(&self, kind: &str) -> bool {
        self.kind == kind && self.group == KEDA_GROUP
    }

    /// `KIND NAMESPACE/NAME`.
    fn describe(&self) -> String {
        let name = self.name.as_deref().unwrap_or("<unnamed>");
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{name}", self.kind),
            None => format!("{} {name}", self.kind),
        }
    }

    fn at(&self) -> String {
        format!("{}: {}", self.origin, self.describe())
    }
}

/// Every document of every input (a `kind: List`'s items one by one), or what could not be read.
fn objects(inputs: &[Input]) -> (Vec<Object>, Vec<ImportError>) {
    let mut objects = Vec::new();
    let mut errors = Vec::new();
    for input in inputs {
        let docs: Vec<Value> = match serde_saphyr::from_multiple(&input.text) {
            Ok(d) => d,
            Err(e) => {
                errors.push(ImportError {
                    at: input.file.clone(),
                    field: String::new(),
                    message: format!(
                        "not valid YAML (give KEDA objects as YAML, e.g. what `kubectl get scaledobject,triggerauthentication -n NAMESPACE -o yaml` prints): {e}"
                    ),
                });
                continue;
            }
        };
        let mut documents = 0;
        for (i, doc) in docs.into_iter().enumerate() {
            if doc.is_null() {
                continue;
            }
            documents += 1;
            let origin = Origin {
                file: input.file.clone(),
                document: i + 1,
                item: None,
            };
            if !doc.is_object() {
                errors.push(ImportError {
                    at: origin.to_string(),
                    field: String::new(),
                    message: "not a Kubernetes object (a map with apiVersion, kind, metadata and spec): give the ScaledObjects and TriggerAuthentications as YAML".into(),
                });
                continue;
            }
            if doc.get("kind").and_then(Value::as_str) == Some("List")
                && let Some(items) = doc.get("items").and_then(Value::as_array)
            {
                for (j, item) in items.iter().enumerate() {
                    objects.push(Object::from_value(
                        Origin {
                            item: Some(j),
                            ..origin.clone()
                        },
                        item.clone(),
                    ));
                }
                continue;
            }
            objects.push(Object::from_value(origin, doc));
        }
        if documents == 0 {
            errors.push(ImportError {
                at: input.file.clone(),
                field: String::new(),
                message: "no YAML documents: give the file holding the ScaledObjects".into(),
            });
        }
    }
    (objects, errors)
}

/// Read QueueConsumers out of the inputs' ScaledObjects. When any input cannot be converted the report
/// holds the errors and no QueueConsumer (the notes stay: they may say why).
pub fn import(inputs: &[Input], opts: &Options) -> Report {
    let (objects, mut errors) = objects(inputs);
    let auths: Vec<&Object> = objects
        .iter()
        .filter(|o| o.is_keda("TriggerAuthentication") || o.is_keda("ClusterTriggerAuthentication"))
        .collect();
    let mut report = Report::default();
    for object in &objects {
        if object.is_keda("ScaledObject") {
            report.scaled_objects += 1;
            let mut ctx = Ctx::new(object);
            let drafts = scaled_object(object, &auths, opts, &mut ctx);
            report.notes.append(&mut ctx.notes);
            errors.append(&mut ctx.errors);
            for draft in drafts {
                match finish(object, draft, opts.with_worker) {
                    Ok(imported) => report.consumers.push(imported),
                    Err(e) => errors.push(e),
                }
            }
        } else if object.is_keda("ScaledJob") {
            report.notes.push(Note {
                at: object.at(),
                field: "kind".into(),
                message: "skipped: a ScaledJob runs a Job per batch of messages; a QueueConsumer scales a long-running workload (import the ScaledObjects only)".into(),
                todo: false,
            });
        } else if !object.is_keda("TriggerAuthentication")
            && !object.is_keda("ClusterTriggerAuthentication")
        {
            report.other_documents += 1;
        }
    }
    if errors.is_empty() && report.scaled_objects == 0 {
        errors.push(ImportError {
            at: inputs
                .iter()
                .map(|i| i.file.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            field: String::new(),
            message: "no KEDA ScaledObject (keda.sh/v1alpha1) in the input: give the files that hold them, or `kubectl get scaledobject,triggerauthentication -n NAMESPACE -o yaml | qc-operator import keda -`".into(),
        });
    }
    if errors.is_empty() && report.consumers.is_empty() {
        errors.push(ImportError {
            at: inputs
                .iter()
                .map(|i| i.file.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            field: String::new(),
            message: format!(
                "no ScaledObject with an {SQS_TRIGGER} trigger: nothing to import (the notes say why each was skipped)"
            ),
        });
    }
    if !errors.is_empty() {
        report.consumers.clear();
    }
    report.errors = errors;
    report
}

/// What one ScaledObject's conversion records.
struct Ctx {
    at: String,
    notes: Vec<Note>,
    errors: Vec<ImportError>,
}

impl Ctx {
    fn new(object: &Object) -> Ctx {
        Ctx {
            at: object.at(),
            notes: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn note(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.notes.push(Note {
            at: self.at.clone(),
            field: field.into(),
            message: message.into(),
            todo: false,
        });
    }

    fn todo(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.notes.push(Note {
            at: self.at.clone(),
            field: field.into(),
            message: message.into(),
            todo: true,
        });
    }

    fn error(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.errors.push(ImportError {
            at: self.at.clone(),
            field: field.into(),
            message: message.into(),
        });
    }
}

/// What the ScaledObject's own fields (not its triggers) carry over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScaleSettings {
    /// `spec.scaleTargetRef` (KEDA's defaults apps/v1 and Deployment applied).
    pub target: Option<api::ScaleTargetRef>,
    /// `minReplicaCount` (or `idleReplicaCount`).
    pub min_replicas: Option<u32>,
    /// `min_replicas` came from `idleReplicaCount`.
    pub idle_replicas: bool,
    /// `maxReplicaCount`; None: KEDA's default, 100.
    pub max_replicas: Option<u32>,
    pub poll_interval: Option<Duration>,
    /// `advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.stabilizationWindowSeconds`.
    pub scale_down_stabilization: Option<Duration>,
    /// A pause annotation that stops scaling (`paused`, or `paused-replicas: "0"`).
    pub suspend: Option<String>,
}

/// A trigger's queue and identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueSettings {
    /// `spec.triggers[N]`.
    pub path: String,
    /// The trigger's `name`, if any.
    pub trigger_name: Option<String>,
    pub url: String,
    pub region: Option<String>,
    pub endpoint: Option<String>,
    /// `queueLength`; None: KEDA's default.
    pub queue_length: Option<u32>,
    pub activation: Option<u32>,
    pub scale_on_in_flight: Option<bool>,
    pub identity: Identity,
}

/// The AWS identity KEDA read the queue with, as far as the QueueConsumer can take it over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Identity {
    /// KEDA's own (or none said): the controller's own.
    #[default]
    Own,
    /// A role ARN, and where it was written.
    Role { arn: String, from: String },
    /// A role ARN kept where the import cannot read it (a Secret, an environment variable): how to find it.
    Elsewhere { hint: String },
}

/// The ScaledObject's QueueConsumers, before they are written out.
#[derive(Clone, Debug)]
struct Draft {
    name: String,
    namespace: Option<String>,
    body: Node,
    header: Vec<String>,
    todos: Vec<String>,
}

fn scaled_object(so: &Object, auths: &[&Object], opts: &Options, ctx: &mut Ctx) -> Vec<Draft> {
    let Some(name) = so.name.clone() else {
        ctx.error(
            "metadata.name",
            "required: the ScaledObject's name becomes the QueueConsumer's; give it one",
        );
        return Vec::new();
    };
    let empty = Map::new();
    let spec = match so.value.get("spec") {
        Some(Value::Object(s)) => s,
        Some(_) => {
            ctx.error("spec", "must be a map (a ScaledObject's spec)");
            return Vec::new();
        }
        None => &empty,
    };
    let triggers: Vec<&Value> = match spec.get("triggers") {
        Some(Value::Array(t)) => t.iter().collect(),
        None | Some(Value::Null) => Vec::new(),
        Some(_) => {
            ctx.error("spec.triggers", "must be a list of triggers");
            return Vec::new();
        }
    };
    let is_sqs = |t: &&Value| t.get("type").and_then(Value::as_str) == Some(SQS_TRIGGER);
    if !triggers.iter().any(is_sqs) {
        let types: Vec<&str> = triggers
            .iter()
            .map(|t| t.get("type").and_then(Value::as_str).unwrap_or("<no type>"))
            .collect();
        ctx.note(
            "spec.triggers",
            format!(
                "skipped: no {SQS_TRIGGER} trigger ({}); a QueueConsumer scales from an SQS queue",
                if types.is_empty() {
                    "no triggers".to_string()
                } else {
                    format!("types: {}", types.join(", "))
                }
            ),
        );
        return Vec::new();
    }
    let settings = scale_settings(&so.value, spec, ctx);
    let mut queues = Vec::new();
    for (i, t) in triggers.iter().enumerate() {
        let path = format!("spec.triggers[{i}]");
        if is_sqs(t) {
            if let Some(q) = trigger(t, &path, so, auths, ctx) {
                queues.push(q);
            }
        } else {
            let ty = t.get("type").and_then(Value::as_str).unwrap_or("<no type>");
            ctx.note(
                format!("{path} (type {ty})"),
                "not mapped: a QueueConsumer scales from its queue alone, where KEDA took the highest of its triggers' replica counts; if this trigger matters (e.g. cpu), keep scaling the workload on it some other way",
            );
        }
    }
    let sqs_count = triggers.iter().filter(|t| is_sqs(t)).count();
    if !opts.with_worker && sqs_count > 1 {
        let paths: Vec<String> = triggers
            .iter()
            .enumerate()
            .filter(|(_, t)| is_sqs(t))
            .map(|(i, _)| format!("triggers[{i}]"))
            .collect();
        let target = settings
            .target
            .as_ref()
            .map_or_else(|| "the target".to_string(), api::ScaleTargetRef::describe);
        ctx.error(
            "spec.triggers",
            format!(
                "{sqs_count} {SQS_TRIGGER} triggers ({}): in scale-only mode a QueueConsumer scales its target from one queue, and one QueueConsumer per queue would have two scalers set the replicas of {target}; keep one trigger, give each queue a workload (and ScaledObject) of its own, or import with --with-worker (one bundled worker per queue)",
                paths.join(", ")
            ),
        );
    }
    if !ctx.errors.is_empty() {
        return Vec::new();
    }
    let Some(target) = settings.target.clone() else {
        return Vec::new();
    };
    let mut taken = BTreeSet::new();
    let several = queues.len() > 1;
    queues
        .iter()
        .map(|q| {
            let qc_name = if several {
                consumer_name(&name, q, &mut taken)
            } else {
                name.clone()
            };
            draft(
                &qc_name,
                so.namespace.clone(),
                so,
                &target,
                &settings,
                q,
                opts,
                ctx,
            )
        })
        .collect()
}

/// `NAME-QUEUE` for one of several queues (the trigger's name, else the queue's), a DNS label.
fn consumer_name(so_name: &str, q: &QueueSettings, taken: &mut BTreeSet<String>) -> String {
    let queue = q
        .trigger_name
        .clone()
        .unwrap_or_else(|| queue_name(&q.url).to_string());
    let mut base = dns_label(&format!("{so_name}-{queue}"));
    if base.is_empty() {
        base = dns_label(so_name);
    }
    let mut name = base.clone();
    let mut n = 2;
    while !taken.insert(name.clone()) {
        let suffix = format!("-{n}");
        let keep = 63usize.saturating_sub(suffix.len()).min(base.len());
        name = format!("{}{suffix}", base[..keep].trim_end_matches('-'));
        n += 1;
    }
    name
}

/// The queue's name: the URL's last path segment.
pub fn queue_name(url: &str) -> &str {
    url.trim_end_matches('/').rsplit('/').next().unwrap_or(url)
}

/// Lowercase letters, digits and single '-', at most 63 characters, no '-' at either end.
pub fn dns_label(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let out = out.trim_matches('-');
    out[..out.len().min(63)].trim_end_matches('-').to_string()
}

/// Go's strconv.ParseBool, as KEDA reads its boolean metadata.
pub fn go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// A whole number KEDA keeps as an int32 field; the error names what was found.
fn int_field(v: &Value) -> Result<i64, String> {
    v.as_i64()
        .ok_or_else(|| format!("expected a whole number, found {v}"))
}

fn seconds(n: i64) -> Duration {
    Duration::from_secs(u64::try_from(n).unwrap_or(0))
}

fn scale_settings(so: &Value, spec: &Map<String, Value>, ctx: &mut Ctx) -> ScaleSettings {
    let mut s = ScaleSettings {
        target: scale_target(spec, ctx),
        ..ScaleSettings::default()
    };
    let count = |key: &str, ctx: &mut Ctx, min: i64| -> Option<i64> {
        let v = spec.get(key)?;
        if v.is_null() {
            return None;
        }
        match int_field(v) {
            Ok(n) if n >= min && n <= i64::from(i32::MAX) => Some(n),
            Ok(n) => {
                ctx.error(
                    format!("spec.{key}"),
                    format!("{n} is out of range: give a whole number from {min} to 2147483647"),
                );
                None
            }
            Err(e) => {
                ctx.error(format!("spec.{key}"), e);
                None
            }
        }
    };
    let min = count("minReplicaCount", ctx, 0);
    let max = count("maxReplicaCount", ctx, 1);
    let idle = count("idleReplicaCount", ctx, 0);
    let polling = count("pollingInterval", ctx, 1);
    let cooldown = count("cooldownPeriod", ctx, 0);
    let initial = count("initialCooldownPeriod", ctx, 0);
    let to_u32 = |n: i64| u32::try_from(n).unwrap_or(u32::MAX);
    s.min_replicas = min.map(to_u32);
    s.max_replicas = max.map(to_u32);
    let effective_max = max.unwrap_or(i64::from(KEDA_DEFAULT_MAX_REPLICAS));
    if let Some(m) = min
        && m > effective_max
    {
        ctx.error(
            "spec.minReplicaCount",
            format!(
                "{m} exceeds maxReplicaCount {effective_max}{}: lower minReplicaCount or raise maxReplicaCount",
                if max.is_none() { " (KEDA's default)" } else { "" }
            ),
        );
    }
    if let Some(idle) = idle {
        let floor = min.unwrap_or(0);
        s.min_replicas = Some(to_u32(idle));
        s.idle_replicas = true;
        if idle >= floor {
            ctx.error(
                "spec.idleReplicaCount",
                format!(
                    "{idle} is not below minReplicaCount {floor}, which KEDA refuses too: remove idleReplicaCount, or set it to 0 with minReplicaCount above it"
                ),
            );
        }
        ctx.note(
            "spec.idleReplicaCount",
            format!(
                "{idle}: scaling.minReplicas is {idle} (the replicas while the queue is idle, as KEDA kept them); KEDA also kept at least minReplicaCount {floor} while messages waited, and a QueueConsumer has no such floor: its replicas follow the backlog (set scaling.minReplicas: {floor} instead to keep {floor} at all times)"
            ),
        );
    }
    if let Some(p) = polling {
        s.poll_interval = Some(seconds(p));
    }
    if let Some(c) = cooldown {
        ctx.note(
            "spec.cooldownPeriod",
            format!(
                "{c} (seconds): not mapped: KEDA waited this long after the last active poll before scaling to zero; a QueueConsumer holds every scale-down, to zero too, for scaling.scaleDownStabilization (default auto: about one measured pod start-up); to wait as KEDA did, set scaling.scaleDownStabilization: {}",
                seconds(c)
            ),
        );
    }
    if let Some(i) = initial {
        ctx.note(
            "spec.initialCooldownPeriod",
            format!(
                "{i} (seconds): not mapped: the controller scales from its first poll, with no grace period after creation; keep pods up with scaling.minReplicas if they must not go to zero at first"
            ),
        );
    }
    if let Some(fallback) = spec.get("fallback").filter(|v| !v.is_null()) {
        let replicas = fallback
            .get("replicas")
            .map_or_else(|| "?".to_string(), Value::to_string);
        ctx.note(
            "spec.fallback",
            format!(
                "not mapped: KEDA moved to {replicas} replicas after failed reads of the queue; when the queue cannot be read the controller holds the replicas where they are (ScalingActive=False, MetricsUnavailable) and says why in QueueReachable"
            ),
        );
    }
    if let Some(advanced) = spec.get("advanced").filter(|v| !v.is_null()) {
        s.scale_down_stabilization = advanced_settings(advanced, ctx);
    }
    for key in spec.keys() {
        if !matches!(
            key.as_str(),
            "scaleTargetRef"
                | "minReplicaCount"
                | "maxReplicaCount"
                | "idleReplicaCount"
                | "pollingInterval"
                | "cooldownPeriod"
                | "initialCooldownPeriod"
                | "fallback"
                | "advanced"
                | "triggers"
        ) {
            ctx.note(
                format!("spec.{key}"),
                "not mapped: not a ScaledObject field this import knows (KEDA's ScaledObject reference lists none of that name)",
            );
        }
    }
    s.suspend = pause(so, ctx);
    s
}

/// `spec.scaleTargetRef`, checked against the QueueConsumer's own rules for it.
fn scale_target(spec: &Map<String, Value>, ctx: &mut Ctx) -> Option<api::ScaleTargetRef> {
    let Some(target) = spec.get("scaleTargetRef").and_then(Value::as_object) else {
        ctx.error(
            "spec.scaleTargetRef",
            "required: the workload KEDA scales (name, and kind and apiVersion unless a Deployment); add it, e.g. scaleTargetRef: {name: orders}",
        );
        return None;
    };
    let text = |key: &str| target.get(key).and_then(Value::as_str).map(str::to_string);
    let Some(name) = text("name").filter(|n| !n.is_empty()) else {
        ctx.error(
            "spec.scaleTargetRef.name",
            "required: the name of the workload KEDA scales (a Deployment unless kind says otherwise); add it, e.g. name: orders",
        );
        return None;
    };
    let api_version = text("apiVersion")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(api::defaults::scale_api_version);
    let kind = text("kind")
        .filter(|k| !k.is_empty())
        .unwrap_or_else(api::defaults::scale_kind);
    let mut ok = true;
    if !is_dns_subdomain(&name) {
        ctx.error(
            "spec.scaleTargetRef.name",
            format!(
                "{name:?} is not a Kubernetes object name: lowercase letters, digits, '-' and '.', at most 253"
            ),
        );
        ok = false;
    }
    if !is_kind(&kind) {
        ctx.error(
            "spec.scaleTargetRef.kind",
            format!(
                "{kind:?} is not a kind: a capitalised name such as Deployment, StatefulSet or Rollout"
            ),
        );
        ok = false;
    }
    if !is_api_version(&api_version) {
        ctx.error(
            "spec.scaleTargetRef.apiVersion",
            format!(
                "{api_version:?} is not an API version: GROUP/VERSION such as apps/v1 or argoproj.io/v1alpha1"
            ),
        );
        ok = false;
    }
    if let Some(c) = text("envSourceContainerName") {
        ctx.note(
            "spec.scaleTargetRef.envSourceContainerName",
            format!(
                "{c:?}: not needed: it named the container whose environment KEDA read its *FromEnv parameters from; a QueueConsumer reads no container's environment"
            ),
        );
    }
    ok.then_some(api::ScaleTargetRef {
        api_version,
        kind,
        name,
    })
}

/// `spec.advanced`: the HPA's scale-down stabilization carries over; the rest is noted.
fn advanced_settings(advanced: &Value, ctx: &mut Ctx) -> Option<Duration> {
    let mut stabilization = None;
    let Some(advanced) = advanced.as_object() else {
        ctx.error("spec.advanced", "must be a map");
        return None;
    };
    for (key, value) in advanced {
        let path = format!("spec.advanced.{key}");
        match key.as_str() {
            "restoreToOriginalReplicaCount" => {
                if value.as_bool() == Some(true) {
                    ctx.note(
                        path,
                        "true: not mapped: a QueueConsumer has no original replica count to restore when it is deleted; set the workload's replicas yourself after deleting it",
                    );
                }
            }
            "horizontalPodAutoscalerConfig" => {
                let Some(hpa) = value.as_object() else {
                    continue;
                };
                for (k, v) in hpa {
                    let p = format!("{path}.{k}");
                    match k.as_str() {
                        "name" => ctx.note(
                            p,
                            "not needed: the controller creates no HorizontalPodAutoscaler, it sets the target's replicas through /scale itself",
                        ),
                        "behavior" => stabilization = behavior(v, &p, ctx),
                        _ => ctx.note(p, "not mapped: not a field this import knows"),
                    }
                }
            }
            "scalingModifiers" => ctx.note(
                path,
                "not mapped: a QueueConsumer has no formula over several metrics; it scales from its queue's counts, its declared processing.p99 and processing.concurrency",
            ),
            _ => ctx.note(path, "not mapped: not a field this import knows"),
        }
    }
    stabilization
}

/// The HPA's `behavior`: `scaleDown.stabilizationWindowSeconds` is exactly
/// `scaling.scaleDownStabilization` (scale down only to the highest recommendation of the window).
fn behavior(v: &Value, path: &str, ctx: &mut Ctx) -> Option<Duration> {
    let mut stabilization = None;
    for (direction, rules) in v.as_object()? {
        let p = format!("{path}.{direction}");
        let Some(rules) = rules.as_object().filter(|_| direction == "scaleDown") else {
            ctx.note(
                p,
                if direction == "scaleUp" {
                    "not mapped: a QueueConsumer scales up to what the backlog needs at once (bounded by maxReplicas and processing.maxRate); there are no scale-up policies"
                } else {
                    "not mapped: not a field of the HPA's behavior"
                },
            );
            continue;
        };
        for (k, value) in rules {
            let q = format!("{p}.{k}");
            if k == "stabilizationWindowSeconds" {
                match int_field(value) {
                    Ok(n) if (0..=3600).contains(&n) => stabilization = Some(seconds(n)),
                    Ok(n) => ctx.error(
                        q,
                        format!("{n} is out of range: the HPA takes 0 to 3600 seconds"),
                    ),
                    Err(e) => ctx.error(q, e),
                }
            } else {
                ctx.note(
                    q,
                    "not mapped: a QueueConsumer has no scale-down policies; its scale-down is held by scaling.scaleDownStabilization alone",
                );
            }
        }
    }
    stabilization
}

/// The pause annotations: one that stops scaling becomes `spec.suspend` (which scales to zero, where
/// KEDA kept the replicas), the others are noted.
fn pause(so: &Value, ctx: &mut Ctx) -> Option<String> {
    let annotations = so
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(Value::as_object)?;
    let mut suspend = None;
    let replicas = annotations.get(PAUSED_REPLICAS).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    for (key, value) in annotations {
        let value = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let path = format!("metadata.annotations[{key}]");
        match key.as_str() {
            PAUSED_REPLICAS => {
                if value.trim() == "0" {
                    suspend = Some(format!("{PAUSED_REPLICAS}: \"0\""));
                    ctx.note(
                        path,
                        "\"0\": mapped to spec.suspend: true (scaled to zero, the scaler paused); remove it to let the QueueConsumer scale",
                    );
                } else {
                    ctx.note(
                        path,
                        format!(
                            "{value:?}: not mapped: KEDA held the target at {value} replicas; spec.suspend would scale it to zero: to hold {value}, set scaling.minReplicas and scaling.maxReplicas to {value}"
                        ),
                    );
                }
            }
            PAUSED => {
                // KEDA: a value that is no boolean counts as true; paused-replicas takes precedence.
                let paused = go_bool(&value).unwrap_or(true);
                if replicas.is_some() {
                    ctx.note(
                        path,
                        format!("{value:?}: not needed: {PAUSED_REPLICAS} decides the pause"),
                    );
                } else if paused {
                    suspend = Some(format!("{PAUSED}: {value:?}"));
                    ctx.note(
                        path,
                        format!(
                            "{value:?}: mapped to spec.suspend: true, which scales the target to zero and pauses the scaler, where KEDA's pause kept the replicas it had; remove spec.suspend to keep the workload running"
                        ),
                    );
                }
            }
            _ if key.contains("keda.sh/") => ctx.note(
                path,
                "not mapped: it configures KEDA's own pausing or its HorizontalPodAutoscaler, which a QueueConsumer does not have",
            ),
            _ => {}
        }
    }
    suspend
}

/// A metadata value: KEDA keeps strings; a number or boolean written without quotes is read as its text.
fn meta_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The trigger's metadata keys KEDA's aws-sqs-queue scaler reads (scalers/aws-sqs.md; the static
/// keys are read by pkg/scalers/aws/aws_common.go).
const STATIC_KEY_PARAMETERS: &[&str] = &[
    "awsAccessKeyID",
    "awsAccessKeyId",
    "awsSecretAccessKey",
    "awsSessionToken",
    "awsAccessKeyIDFromEnv",
    "awsSecretAccessKeyFromEnv",
];

fn trigger(
    t: &Value,
    path: &str,
    so: &Object,
    auths: &[&Object],
    ctx: &mut Ctx,
) -> Option<QueueSettings> {
    let Some(meta) = t.get("metadata").and_then(Value::as_object) else {
        ctx.error(
            format!("{path}.metadata"),
            "required: the trigger's parameters (queueURL, awsRegion...)",
        );
        return None;
    };
    let text = |key: &str, ctx: &mut Ctx| -> Option<String> {
        let v = meta.get(key)?;
        match meta_text(v) {
            Some(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
            Some(_) => None,
            None => {
                ctx.error(
                    format!("{path}.metadata.{key}"),
                    format!("expected a string, found {v}"),
                );
                None
            }
        }
    };
    let url = text("queueURL", ctx);
    let from_env = text("queueURLFromEnv", ctx);
    let region = text("awsRegion", ctx);
    let endpoint = text("awsEndpoint", ctx);
    let queue_length = text("queueLength", ctx);
    let activation = text("activationQueueLength", ctx);
    let in_flight = text("scaleOnInFlight", ctx);
    let delayed = text("scaleOnDelayed", ctx);
    let owner = text("identityOwner", ctx);
    let field = |key: &str| format!("{path}.metadata.{key}");

    let url = match (url, from_env) {
        (Some(url), from_env) => {
            if let Some(var) = from_env {
                ctx.note(
                    field("queueURLFromEnv"),
                    format!("{var:?}: not needed: queueURL is set, and KEDA uses it first too"),
                );
            }
            url
        }
        (None, Some(var)) => {
            ctx.error(
                field("queueURLFromEnv"),
                format!(
                    "{var:?} names an environment variable of the scaled workload's container, which this import does not read (it reads the files given, not the cluster), and a QueueConsumer holds the queue URL itself: add queueURL with that variable's value to the trigger (kubectl get {} -o yaml shows it) and import again",
                    so.value
                        .pointer("/spec/scaleTargetRef/name")
                        .and_then(Value::as_str)
                        .map_or_else(|| "the workload".to_string(), |n| format!(
                            "{} {n}{}",
                            so.value
                                .pointer("/spec/scaleTargetRef/kind")
                                .and_then(Value::as_str)
                                .unwrap_or("deployment")
                                .to_ascii_lowercase(),
                            so.namespace.as_ref().map_or_else(String::new, |ns| format!(" -n {ns}"))
                        ))
                ),
            );
            return None;
        }
        (None, None) => {
            ctx.error(
                field("queueURL"),
                "required: the queue's URL, e.g. queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
            );
            return None;
        }
    };
    if !url.contains("://") {
        let region_hint = region.as_deref().unwrap_or("REGION");
        ctx.error(
            field("queueURL"),
            format!(
                "{url:?} is a queue name, which KEDA looks up; a QueueConsumer needs the queue's URL: write it in full, e.g. https://sqs.{region_hint}.amazonaws.com/ACCOUNT_ID/{url} (`aws sqs get-queue-url --queue-name {url} --region {region_hint}` prints it)"
            ),
        );
        return None;
    }
    if !is_http_url(&url) {
        ctx.error(
            field("queueURL"),
            format!(
                "{url:?} is not an http(s) URL of printable characters without spaces (at most 1024): write the queue's URL, e.g. https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
            ),
        );
        return None;
    }
    if let Some(r) = &region
        && !is_region(r)
    {
        ctx.error(
            field("awsRegion"),
            format!("{r:?} is not an AWS region: write one such as eu-west-1"),
        );
    }
    if let Some(e) = &endpoint
        && !is_http_url(e)
    {
        ctx.error(
            field("awsEndpoint"),
            format!(
                "{e:?} is not an http(s) URL of printable characters without spaces: write e.g. http://localstack:4566, or leave it out on AWS"
            ),
        );
    }
    let queue_length = match queue_length {
        None => None,
        Some(s) => match s.parse::<u32>() {
            Ok(n) if (1..=api::MAX_CONCURRENCY).contains(&n) => Some(n),
            _ => {
                ctx.error(
                    field("queueLength"),
                    format!(
                        "{s:?}: give a whole number from 1 to {} (messages per replica), or pass --concurrency",
                        api::MAX_CONCURRENCY
                    ),
                );
                None
            }
        },
    };
    let activation = match activation {
        None => None,
        Some(s) => match s.parse::<u32>() {
            Ok(n) if i64::from(n) <= i64::from(i32::MAX) => Some(n),
            _ => {
                ctx.error(
                    field("activationQueueLength"),
                    format!("{s:?}: give a whole number of messages, 0 or more"),
                );
                None
            }
        },
    };
    let flag = |key: &str, value: Option<String>, ctx: &mut Ctx| -> Option<bool> {
        let s = value?;
        let b = go_bool(&s);
        if b.is_none() {
            ctx.error(field(key), format!("{s:?}: write true or false"));
        }
        b
    };
    let scale_on_in_flight = flag("scaleOnInFlight", in_flight, ctx);
    if flag("scaleOnDelayed", delayed, ctx) == Some(true) {
        ctx.note(
            field("scaleOnDelayed"),
            "true: not mapped: a QueueConsumer does not count delayed messages (they cannot be received yet); it scales when they become visible",
        );
    }
    let operator = match owner.as_deref() {
        None | Some("pod") => false,
        Some("operator") => true,
        Some(other) => {
            ctx.error(
                field("identityOwner"),
                format!("{other:?}: KEDA takes pod or operator"),
            );
            false
        }
    };
    for key in STATIC_KEY_PARAMETERS {
        if meta.contains_key(*key) {
            ctx.note(
                field(key),
                "not mapped: static AWS keys are not used by a QueueConsumer: the controller reads the queue with its own identity, or assumes spec.aws.roleArn; give the keys' permissions to an IAM role (IRSA or EKS Pod Identity) instead",
            );
        }
    }
    for key in meta.keys() {
        if !matches!(
            key.as_str(),
            "queueURL"
                | "queueURLFromEnv"
                | "awsRegion"
                | "awsEndpoint"
                | "queueLength"
                | "activationQueueLength"
                | "scaleOnInFlight"
                | "scaleOnDelayed"
                | "identityOwner"
        ) && !STATIC_KEY_PARAMETERS.contains(&key.as_str())
        {
            ctx.note(
                field(key),
                "not mapped: not a parameter of KEDA's aws-sqs-queue trigger (KEDA ignores it too)",
            );
        }
    }
    if let Some(mt) = t.get("metricType").and_then(Value::as_str)
        && mt != "AverageValue"
    {
        ctx.note(
            format!("{path}.metricType"),
            format!(
                "{mt:?}: not mapped: a QueueConsumer's replicas follow its queue's counts per replica, as AverageValue (KEDA's default) did"
            ),
        );
    }
    if t.get("useCachedMetrics").and_then(Value::as_bool) == Some(true) {
        ctx.note(
            format!("{path}.useCachedMetrics"),
            "true: not needed: the controller reads the queue once per scaling.pollInterval and shares the reading",
        );
    }
    let identity = identity(t, path, operator, so, auths, ctx);
    Some(QueueSettings {
        path: path.to_string(),
        trigger_name: t
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .map(str::to_string),
        url,
        region,
        endpoint,
        queue_length,
        activation,
        scale_on_in_flight,
        identity,
    })
}

/// The identity KEDA read the queue with: the TriggerAuthentication's pod identity and the parameters
/// it resolves (KEDA's pkg/scalers/aws/aws_common.go: provider `aws` with its roleArn, else an
/// `awsRoleArn` parameter; `aws-eks` the workload's role; `identityOwner: operator` KEDA's own).
fn identity(
    t: &Value,
    path: &str,
    operator: bool,
    so: &Object,
    auths: &[&Object],
    ctx: &mut Ctx,
) -> Identity {
    let Some(auth_ref) = t.get("authenticationRef").filter(|v| !v.is_null()) else {
        return Identity::Own;
    };
    let ref_path = format!("{path}.authenticationRef");
    let Some(name) = auth_ref.get("name").and_then(Value::as_str) else {
        ctx.error(
            format!("{ref_path}.name"),
            "required: the TriggerAuthentication's name",
        );
        return Identity::Own;
    };
    let kind = auth_ref
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("TriggerAuthentication");
    let cluster = kind == "ClusterTriggerAuthentication";
    if !cluster && kind != "TriggerAuthentication" {
        ctx.error(
            format!("{ref_path}.kind"),
            format!("{kind:?}: KEDA takes TriggerAuthentication or ClusterTriggerAuthentication"),
        );
        return Identity::Own;
    }
    let same_name = |a: &&&Object| a.kind == kind && a.name.as_deref() == Some(name);
    let found = auths
        .iter()
        .filter(same_name)
        .find(|a| cluster || a.namespace == so.namespace)
        .or_else(|| {
            // files often leave namespaces out: one side without a namespace matches by name
            auths
                .iter()
                .filter(same_name)
                .find(|a| a.namespace.is_none() || so.namespace.is_none())
        });
    let Some(auth) = found else {
        let ns = match (&so.namespace, cluster) {
            (Some(ns), false) => format!(" -n {ns}"),
            _ => String::new(),
        };
        let lower = kind.to_ascii_lowercase();
        ctx.error(
            format!("{ref_path}.name"),
            format!(
                "{kind} {name:?} is not in the files given: add the file that holds it (`kubectl get {lower} {name}{ns} -o yaml > {name}.yaml`) and import again"
            ),
        );
        return Identity::Own;
    };
    let auth_desc = auth.describe();
    let at = |f: &str| format!("{auth_desc} {f}");
    let Some(spec) = auth.value.get("spec").and_then(Value::as_object) else {
        return Identity::Own;
    };
    let target = so
        .value
        .pointer("/spec/scaleTargetRef/name")
        .and_then(Value::as_str)
        .unwrap_or("the workload");
    let workload_role = format!(
        "the role annotated (eks.amazonaws.com/role-arn) on the ServiceAccount of the pods of {target}"
    );
    let external_id = format!("qc:{}", so.namespace.as_deref().unwrap_or("NAMESPACE"));
    let mut identity = Identity::Own;
    let mut pod_identity_role = false;
    let mut provider_aws = false;
    if let Some(pi) = spec.get("podIdentity").and_then(Value::as_object) {
        let provider = pi.get("provider").and_then(Value::as_str).unwrap_or("none");
        let text = |k: &str| pi.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
        match provider {
            "aws" => {
                provider_aws = true;
                if let Some(arn) = text("roleArn") {
                    pod_identity_role = true;
                    if is_role_arn(arn) {
                        identity = Identity::Role {
                            arn: arn.to_string(),
                            from: format!("{auth_desc} spec.podIdentity.roleArn"),
                        };
                    } else {
                        ctx.error(
                            at("spec.podIdentity.roleArn"),
                            format!(
                                "{arn:?} is not an IAM role ARN: write one such as arn:aws:iam::123456789012:role/orders-scaler"
                            ),
                        );
                    }
                }
                if let Some(id) = text("externalID") {
                    ctx.note(
                        at("spec.podIdentity.externalID"),
                        format!(
                            "{id:?}: not mapped: the controller assumes spec.aws.roleArn with ExternalId {external_id}, its own: change the role's trust policy to expect that"
                        ),
                    );
                }
                if text("identityOwner") == Some("workload") {
                    ctx.todo(
                        at("spec.podIdentity.identityOwner"),
                        format!(
                            "\"workload\": not mapped: KEDA assumed {workload_role}; the controller reads the queue with its own identity unless spec.aws.roleArn names a role: set it to that role (and let the qc-operator's role assume it), or leave it out if the controller's own role may read the queue"
                        ),
                    );
                    identity = Identity::Elsewhere {
                        hint: workload_role.clone(),
                    };
                }
            }
            "aws-eks" | "aws-kiam" => {
                if !operator {
                    ctx.todo(
                        at("spec.podIdentity.provider"),
                        format!(
                            "{provider:?} (deprecated or removed in KEDA): not mapped: KEDA read the queue as {workload_role}; the controller reads it with its own identity unless spec.aws.roleArn names a role: set it to that role (and let the qc-operator's role assume it), or leave it out if the controller's own role may read the queue"
                        ),
                    );
                    identity = Identity::Elsewhere {
                        hint: workload_role.clone(),
                    };
                }
            }
            "none" => {}
            other => ctx.note(
                at("spec.podIdentity.provider"),
                format!("{other:?}: not mapped: not an AWS identity, which is what SQS takes"),
            ),
        }
    }
    // The parameters KEDA resolves from Secrets, ConfigMaps and the workload's environment.
    for (source, what) in [
        ("secretTargetRef", "Secret"),
        ("configMapTargetRef", "ConfigMap"),
        ("env", "environment variable"),
    ] {
        let Some(refs) = spec.get(source).and_then(Value::as_array) else {
            continue;
        };
        for (j, r) in refs.iter().enumerate() {
            let parameter = r.get("parameter").and_then(Value::as_str).unwrap_or("");
            let rname = r.get("name").and_then(Value::as_str).unwrap_or("?");
            let where_ = if source == "env" {
                format!("environment variable {rname} of the container of {target}")
            } else {
                let key = r.get("key").and_then(Value::as_str).unwrap_or("?");
                format!("{what} {rname}, key {key}")
            };
            let f = at(&format!("spec.{source}[{j}] ({parameter})"));
            match parameter {
                "awsRoleArn" => {
                    if pod_identity_role || operator && !provider_aws {
                        ctx.note(
                            f,
                            "not needed: KEDA did not use it (podIdentity.roleArn or identityOwner: operator decides)",
                        );
                    } else {
                        ctx.todo(
                            f,
                            format!(
                                "not mapped: the role ARN KEDA assumed is in {where_}, which this import does not read: set spec.aws.roleArn to it (and let the qc-operator's role assume it, with ExternalId {external_id})"
                            ),
                        );
                        identity = Identity::Elsewhere {
                            hint: format!("the role ARN in {where_}"),
                        };
                    }
                }
                "awsAccessKeyID" | "awsAccessKeyId" | "awsSecretAccessKey" | "awsSessionToken" => {
                    ctx.note(
                        f,
                        "not mapped: static AWS keys are not used by a QueueConsumer: the controller reads the queue with its own identity, or assumes spec.aws.roleArn; give the keys' permissions to an IAM role (IRSA or EKS Pod Identity) and name it in spec.aws.roleArn",
                    );
                }
                "awsRegion" => ctx.note(
                    f,
                    format!(
                        "not mapped: the region in {where_} is not read: spec.queue.region is taken from the trigger's awsRegion, else from the queue URL"
                    ),
                ),
                _ => ctx.note(
                    f,
                    "not mapped: not a parameter of KEDA's aws-sqs-queue trigger",
                ),
            }
        }
    }
    for key in spec.keys() {
        if !matches!(
            key.as_str(),
            "podIdentity" | "secretTargetRef" | "configMapTargetRef" | "env"
        ) {
            ctx.note(
                at(&format!("spec.{key}")),
                "not mapped: a QueueConsumer reads no secret store: its AWS identity is the controller's own or the role in spec.aws.roleArn",
            );
        }
    }
    identity
}

/// One QueueConsumer from the ScaledObject's settings and one of its queues.
#[allow(clippy::too_many_arguments)]
fn draft(
    name: &str,
    namespace: Option<String>,
    so: &Object,
    target: &api::ScaleTargetRef,
    s: &ScaleSettings,
    q: &QueueSettings,
    opts: &Options,
    ctx: &mut Ctx,
) -> Draft {
    let mut todos = Vec::new();
    let ns = namespace.as_deref().unwrap_or("NAMESPACE");
    let ns_flag = namespace
        .as_ref()
        .map_or_else(String::new, |ns| format!(" -n {ns}"));

    let mut queue = Node::map().field_from("url", Node::str(&q.url), "queueURL");
    if let Some(r) = &q.region {
        queue = queue.field_from("region", Node::str(r), "awsRegion");
    }
    if let Some(e) = &q.endpoint {
        queue = queue.field_with(
            "endpoint",
            Node::str(e),
            vec![
                "From awsEndpoint. The controller calls it only if its operator allows it (chart value aws.allowedEndpoints); otherwise ConfigValid=False, EndpointNotAllowed.".into(),
            ],
        );
    }
    let mut spec = Node::map().field("queue", queue);
    match &q.identity {
        Identity::Own => {}
        Identity::Role { arn, from } => {
            let mut comment = format!(
                "From {from}. Its trust policy must now let the qc-operator's role assume it, with ExternalId qc:{ns} (docs/security.md), instead of KEDA's."
            );
            if opts.with_worker {
                comment.push_str(
                    " The worker pods assume it too: it needs the worker's permissions on the queue.",
                );
            }
            spec = spec.field_with(
                "aws",
                Node::map().field("roleArn", Node::str(arn)),
                vec![comment],
            );
        }
        Identity::Elsewhere { hint } => {
            todos.push("spec.aws.roleArn".to_string());
            spec = spec.comment(vec![
                format!(
                    "{TODO}: aws.roleArn: KEDA used {hint}, which the import cannot read. Set it here (its trust policy must let the qc-operator's role assume it, with ExternalId qc:{ns}), or leave it out if the controller's own role may read the queue:"
                ),
                "  aws: {roleArn: arn:aws:iam::ACCOUNT_ID:role/NAME}".into(),
            ]);
        }
    }
    if !opts.with_worker {
        spec = spec.field(
            "scaleTargetRef",
            Node::map()
                .field("apiVersion", Node::str(&target.api_version))
                .field("kind", Node::str(&target.kind))
                .field("name", Node::str(&target.name)),
        );
    }

    // processing: the declared P99 and concurrency that KEDA's queueLength stood for
    let queue_length = q.queue_length.unwrap_or(KEDA_DEFAULT_QUEUE_LENGTH);
    let concurrency = opts.concurrency.unwrap_or(queue_length);
    let mut processing = Node::map();
    let p99 = if let Some(p) = opts.p99 {
        processing = processing.field_from("p99", Node::Plain(p.to_string()), "--p99");
        p
    } else {
        todos.push("spec.processing.p99".to_string());
        processing = processing.field_with(
                "p99",
                Node::Plain(PLACEHOLDER_P99.to_string()),
                vec![format!(
                    "{TODO}: p99 is a placeholder: declare your consumer's P99 time to handle ONE message (e.g. 2s, from its metrics or logs); it sizes the replicas and the visibility-timeout rules. Until then it equals scaling.maxBacklogAge below, so each visible message counts as one slot, as KEDA counted it: about KEDA's ceil((visible + in flight) / {concurrency})."
                )],
            );
        PLACEHOLDER_P99
    };
    if p99 > api::defaults::timeout() {
        processing = processing.field_from("timeout", Node::Plain(p99.to_string()), "at least p99");
    }
    let from = match (opts.concurrency, q.queue_length) {
        (Some(_), _) => "--concurrency".to_string(),
        (None, Some(n)) => format!("queueLength {n}"),
        (None, None) => format!("KEDA's default queueLength {KEDA_DEFAULT_QUEUE_LENGTH}"),
    };
    processing = processing.field_with(
        "concurrency",
        Node::Int(i64::from(concurrency)),
        vec![format!(
            "From {from}: messages one replica handles at once. {}",
            if opts.with_worker {
                "The worker makes this many handler calls at once per pod: set what your handler takes."
            } else {
                "Set what your consumer really handles at once per pod (it sizes the in-flight term)."
            }
        )],
    );
    ctx.note(
        format!("{}.metadata.queueLength", q.path),
        format!(
            "{queue_length}{}: does not map 1:1: KEDA kept {queue_length} messages (visible + in flight) per replica; a QueueConsumer sizes replicas from processing.p99 (time per message) and processing.concurrency (messages one replica handles at once), draining the visible backlog within scaling.maxBacklogAge: concurrency {concurrency} ({}), p99 {}",
            if q.queue_length.is_none() {
                " (KEDA's default)"
            } else {
                ""
            },
            if opts.concurrency.is_some() {
                "from --concurrency"
            } else {
                "from queueLength: set what your consumer handles at once"
            },
            if opts.p99.is_some() {
                format!("{p99} (from --p99)")
            } else {
                format!(
                    "{PLACEHOLDER_P99} is a placeholder (with maxBacklogAge {PLACEHOLDER_P99}: KEDA's count) until you declare your consumer's P99"
                )
            }
        ),
    );
    if opts.p99.is_none() {
        ctx.todo(
            format!("QueueConsumer {name}: spec.processing.p99"),
            format!(
                "placeholder {PLACEHOLDER_P99}: declare your consumer's P99 time to handle one message (or import with --p99 DURATION)"
            ),
        );
    }
    spec = spec.field("processing", processing);

    if opts.with_worker {
        todos.push("spec.handler".to_string());
        todos.push("spec.template".to_string());
        spec = spec.field_with(
            "handler",
            Node::map().field(
                "http",
                Node::map()
                    .field("port", Node::Int(8080))
                    .field("path", Node::str("/messages")),
            ),
            vec![format!(
                "{TODO}: the worker POSTs each message to your handler (2xx done, 400/422 poison, anything else retry; docs/handler-contract.md): set its port and path, or use exec (a command per message)."
            )],
        );
        spec = spec.comment(vec![
            format!(
                "{TODO}: template is required: the pod template of your handler's container (the controller adds the qc-worker container). Start from the one KEDA scaled, whose container polled SQS itself; make it serve the handler instead, and keep its serviceAccountName (its IAM role now receives and deletes: docs/security.md):"
            ),
            format!(
                "  kubectl get {} {}{ns_flag} -o jsonpath='{{.spec.template}}'",
                target.kind.to_ascii_lowercase(),
                target.name
            ),
            "  template:".into(),
            "    spec:".into(),
            "      serviceAccountName: SERVICE_ACCOUNT".into(),
            "      containers: [{name: handler, image: IMAGE}]".into(),
        ]);
        ctx.todo(
            format!("QueueConsumer {name}: spec.handler, spec.template"),
            format!(
                "placeholders: the bundled worker needs your handler (an HTTP server or a command per message) and the pod template it runs in; see the {TODO} comments, which start from the pod template of {}",
                target.describe()
            ),
        );
        if name == target.name && target.kind == "Deployment" {
            ctx.note(
                "metadata.name",
                format!(
                    "{name:?}: the worker Deployment is named after the QueueConsumer, as {} already is: the controller leaves that one alone (Ready=False, DeploymentNotOwned) until it is deleted; rename the QueueConsumer (e.g. {name}-worker) to run both while you switch",
                    target.describe()
                ),
            );
        }
    }

    let mut scaling = Node::map();
    if let Some(m) = s.min_replicas {
        scaling = scaling.field_from(
            "minReplicas",
            Node::Int(i64::from(m)),
            if s.idle_replicas {
                "idleReplicaCount"
            } else {
                "minReplicaCount"
            },
        );
    }
    scaling = match s.max_replicas {
        Some(m) => scaling.field_from("maxReplicas", Node::Int(i64::from(m)), "maxReplicaCount"),
        None => scaling.field_from(
            "maxReplicas",
            Node::Int(i64::from(KEDA_DEFAULT_MAX_REPLICAS)),
            "KEDA's default maxReplicaCount (a QueueConsumer's is 20)",
        ),
    };
    if opts.p99.is_none() {
        scaling = scaling.field_with(
            "maxBacklogAge",
            Node::Plain(PLACEHOLDER_P99.to_string()),
            vec![
                "Equal to the placeholder p99 (KEDA's count). Once p99 is yours, remove this line (default 1m: the visible backlog drained within a minute) or set how long messages may wait.".into(),
            ],
        );
    }
    if let Some(p) = s.poll_interval {
        scaling = scaling.field_from(
            "pollInterval",
            Node::Plain(p.to_string()),
            "pollingInterval",
        );
    }
    if let Some(a) = q.activation {
        scaling = scaling.field_from(
            "activationBacklog",
            Node::Int(i64::from(a)),
            "activationQueueLength",
        );
    }
    if let Some(f) = q.scale_on_in_flight {
        scaling = scaling.field_from("scaleOnInFlight", Node::Bool(f), "scaleOnInFlight");
    }
    if let Some(d) = s.scale_down_stabilization {
        scaling = scaling.field_from(
            "scaleDownStabilization",
            Node::Plain(d.to_string()),
            "behavior.scaleDown.stabilizationWindowSeconds",
        );
    }
    spec = spec.field("scaling", scaling);
    if let Some(why) = &s.suspend {
        spec = spec.field_with(
            "suspend",
            Node::Bool(true),
            vec![format!(
                "From {why}. It scales to zero and pauses the scaler (KEDA's pause kept the replicas): remove it to let the QueueConsumer scale."
            )],
        );
    }

    let mut header = vec![format!(
        "Imported by qc-operator import keda from {} ({}).",
        so.describe(),
        so.origin
    )];
    if opts.with_worker {
        header.push(format!(
            "Bundled worker: the controller runs qc-worker, which receives from {}, hands each message to your handler and deletes it once handled. When it runs, delete the ScaledObject and scale {} to zero.",
            queue_name(&q.url),
            target.describe()
        ));
    } else {
        header.push(format!(
            "Scale-only mode: the controller sets the replicas of {} through /scale from the queue's counts, once the target opts in: {}. Delete the ScaledObject before applying this: KEDA's HPA would set them too.",
            target.describe(),
            target.opt_in_command(namespace.as_deref(), name)
        ));
    }
    if !todos.is_empty() {
        header.push(format!(
            "NOT READY TO APPLY: fill in {} (marked {TODO}).",
            todos.join(", ")
        ));
    }
    let mut metadata = Node::map().field("name", Node::str(name));
    if let Some(ns) = &namespace {
        metadata = metadata.field("namespace", Node::str(ns));
    }
    let body = Node::map()
        .field("apiVersion", Node::str(API_VERSION))
        .field("kind", Node::str(KIND))
        .field("metadata", metadata)
        .field("spec", spec);
    Draft {
        name: name.to_string(),
        namespace,
        body,
        header,
        todos,
    }
}

/// The draft as YAML, checked before it is printed: the text parses back to exactly the data, that
/// data is a QueueConsumer the CRD's schema and rules admit, and its mode is the one asked for.
fn finish(so: &Object, draft: Draft, with_worker: bool) -> Result<Imported, ImportError> {
    let mut yaml = String::new();
    super::yaml::write_comment(&draft.header, 0, &mut yaml);
    yaml.push_str(&draft.body.to_yaml());
    let refused = |message: String| ImportError {
        at: so.at(),
        field: String::new(),
        message: format!(
            "the QueueConsumer {} made from it would be refused: {message}; this is a fault of the import: please report it with the ScaledObject",
            draft.name
        ),
    };
    let back: Value = serde_saphyr::from_str(&yaml)
        .map_err(|e| refused(format!("its YAML does not parse back: {e}")))?;
    if back != draft.body.to_json() {
        return Err(refused("its YAML reads back as other data".into()));
    }
    let consumer = match manifest::load_str(&yaml).map_err(refused)?.as_slice() {
        [Document::Valid(qc)] => (**qc).clone(),
        [Document::Invalid { errors, .. }] => {
            return Err(refused(
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; "),
            ));
        }
        _ => return Err(refused("it is not one QueueConsumer document".into())),
    };
    if let Some((field, message, _)) = consumer.spec.mode_conflict() {
        return Err(refused(format!("{field}: {message}")));
    }
    if matches!(consumer.spec.mode(), Mode::ScaleOnly(_)) == with_worker
        || consumer.metadata.namespace != draft.namespace
    {
        return Err(refused(
            "it is not in the mode or namespace asked for".into(),
        ));
    }
    Ok(Imported {
        source: so.describe(),
        origin: so.origin.clone(),
        yaml,
        consumer,
        todos: draft.todos,
    })
}

/// `^https?://[!-~]+$`, at most 1024 characters (the CRD's rule for queue.url and queue.endpoint).
pub fn is_http_url(s: &str) -> bool {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"));
    s.len() <= 1024
        && rest.is_some_and(|r| !r.is_empty() && r.chars().all(|c| ('!'..='~').contains(&c)))
}

/// `^[a-z]{2}(-[a-z]+)+-[0-9]+$` (the CRD's rule for queue.region).
pub fn is_region(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() >= 3
        && s.len() <= 32
        && parts[0].len() == 2
        && parts[0].chars().all(|c| c.is_ascii_lowercase())
        && parts[1..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts
            .last()
            .is_some_and(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// `^arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$` (the CRD's rule for aws.roleArn).
pub fn is_role_arn(s: &str) -> bool {
    let Some(rest) = s.strip_prefix("arn:aws") else {
        return false;
    };
    let Some((partition, rest)) = rest.split_once(':') else {
        return false;
    };
    let partition_ok = partition.is_empty()
        || (partition.starts_with('-')
            && partition[1..]
                .split('-')
                .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase())));
    let Some(rest) = rest.strip_prefix("iam::") else {
        return false;
    };
    let Some((account, rest)) = rest.split_once(':') else {
        return false;
    };
    let Some(role) = rest.strip_prefix("role/") else {
        return false;
    };
    partition_ok
        && s.len() <= 2048
        && account.len() == 12
        && account.chars().all(|c| c.is_ascii_digit())
        && !role.is_empty()
        && role
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+=,.@_/-".contains(c))
}

/// `^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`, at most 253 (the CRD's rule for scaleTargetRef.name).
pub fn is_dns_subdomain(s: &str) -> bool {
    let edge = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.starts_with(edge)
        && s.ends_with(edge)
        && s.chars().all(|c| edge(c) || c == '-' || c == '.')
}

/// `^[A-Z][A-Za-z0-9]*$`, at most 63 (the CRD's rule for scaleTargetRef.kind).
pub fn is_kind(s: &str) -> bool {
    s.len() <= 63
        && s.starts_with(|c: char| c.is_ascii_uppercase())
        && s.chars().all(|c| c.is_ascii_alphanumeric())
}

/// `(GROUP/)?vN((alpha|beta)N)?`, at most 316 (the CRD's rule for scaleTargetRef.apiVersion).
pub fn is_api_version(s: &str) -> bool {
    let (group, version) = match s.rsplit_once('/') {
        Some((g, v)) => (Some(g), v),
        None => (None, s),
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && l.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let group_ok = group.is_none_or(|g| g.split('.').all(label));
    let version_ok = version.strip_prefix('v').is_some_and(|v| {
        let digits = v.chars().take_while(char::is_ascii_digit).count();
        let (major, tail) = v.split_at(digits);
        !major.is_empty()
            && (tail.is_empty()
                || ["alpha", "beta"].iter().any(|stage| {
                    tail.strip_prefix(stage)
                        .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
                }))
    });
    s.len() <= 316 && group_ok && version_ok
}

#[cfg(test)]
mod tests;
