//! The `QueueConsumer` API (`sqs.consumers.dev/v1alpha1`): spec, status and condition names.
//! The CRD is generated from these types (`qc-operator crd`); CEL rules mirror what `validate` can check without AWS.

/// Serialize through `Display`, deserialize through `FromStr` (its error is the message), and an inline
/// string schema: for the spec's types whose YAML form is one string (a duration, `auto` or a
/// duration, an idempotency key). The schema name is the type's name.
macro_rules! string_form {
    ($ty:ident, $schema:tt) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let s = <String as serde::Deserialize>::deserialize(deserializer)?;
                s.parse().map_err(serde::de::Error::custom)
            }
        }

        impl schemars::JsonSchema for $ty {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($ty).into()
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                schemars::json_schema!($schema)
            }
        }
    };
}

pub mod conditions;
mod duration;
pub mod quantity;
mod stabilization;

pub use duration::{AUTO_OR_DURATION_PATTERN, DURATION_PATTERN, Duration, DurationError};
pub use stabilization::{
    DEFAULT_STARTUP, STABILIZATION_PATTERN, Stabilization, StabilizationError,
};

use std::fmt;
use std::str::FromStr;

use k8s_openapi::api::core::v1::PodTemplateSpec;
pub use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
pub use quantity::is_quantity;
use schemars::transform::RecursiveTransform;
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "sqs.consumers.dev";
pub const KIND: &str = "QueueConsumer";
pub const API_VERSION: &str = "sqs.consumers.dev/v1alpha1";
/// Annotation that asks for one move of the DLQ's messages back to the source: any new value (a token)
/// starts one redrive; progress is in `status.deadLetter.redrive`.
pub const REDRIVE_REQUEST_ANNOTATION: &str = "sqs.consumers.dev/redrive-request";
/// Annotation on a scale-only target (`spec.scaleTargetRef`) naming the one QueueConsumer of its
/// namespace that may scale it. Without it the controller does not write the target's `/scale`: creating
/// a QueueConsumer must not let anyone scale a workload they could not scale themselves.
pub const SCALED_BY_ANNOTATION: &str = "sqs.consumers.dev/scaled-by";

/// Desired state of a QueueConsumer: which queue, how messages are processed, by what, at what scale.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "sqs.consumers.dev",
    version = "v1alpha1",
    kind = "QueueConsumer",
    plural = "queueconsumers",
    singular = "queueconsumer",
    shortname = "qc",
    doc = "QueueConsumer runs an Amazon SQS consumer: a worker Deployment scaled from the queue, checked against the queue's settings, with dead-letter health in status.",
    category = "sqs",
    namespaced,
    status = "QueueConsumerStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","description":"Why the QueueConsumer is (not) Ready: the Ready condition's reason","jsonPath":".status.conditions[?(@.type==\"Ready\")].reason"}"#,
    printcolumn = r#"{"name":"Replicas","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Visible","type":"integer","jsonPath":".status.queue.visible"}"#,
    printcolumn = r#"{"name":"InFlight","type":"integer","jsonPath":".status.queue.inFlight"}"#,
    printcolumn = r#"{"name":"DLQ","type":"integer","jsonPath":".status.deadLetter.visible"}"#,
    printcolumn = r#"{"name":"Suspended","type":"boolean","jsonPath":".spec.suspend"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(transform = RecursiveTransform(kubernetes_integers))]
#[x_kube(validation = Rule::new("has(self.scaleTargetRef) || has(self.handler)").message("spec sets neither handler nor scaleTargetRef: set handler and template to run your handler behind the bundled qc-worker, or scaleTargetRef (kind, name) to scale the Deployment that already runs your own consumer").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!has(self.scaleTargetRef) || (!has(self.handler) && (!has(self.template) || !has(self.template.spec)) && !has(self.filter) && (!has(self.idempotency) || !has(self.idempotency.store) || self.idempotency.store == 'none'))").message("spec.scaleTargetRef (scale-only mode: your own consumer, scaled through /scale) excludes handler, template, filter and idempotency.store, which configure the bundled qc-worker: remove them, or remove scaleTargetRef to run the bundled worker").reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new(format!("!has(self.scaling) || !has(self.scaling.objective) || {}", duration::when_durations(&["processing.p99", "scaling.objective.dwellP99"], "duration(self.scaling.objective.dwellP99) > duration(self.processing.p99)"))).message("spec.scaling.objective.dwellP99 must be greater than processing.p99: a message's dwell includes its handling, so a dwellP99 at or below the declared P99 can never be met; raise dwellP99 or lower processing.p99").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.scaleTargetRef) || !has(self.scaling) || !has(self.scaling.objective)").message("spec.scaling.objective needs the bundled qc-worker, whose pods measure each message's dwell; scale-only mode (scaleTargetRef) has no such measurement: remove scaling.objective, or remove scaleTargetRef to run the bundled worker").reason(Reason::FieldValueForbidden))]
pub struct QueueConsumerSpec {
    /// The SQS queue to consume. Required.
    pub queue: QueueSpec,
    /// The AWS identity this QueueConsumer acts with. Default: the controller's and the worker pods'
    /// own (their service accounts' roles).
    #[serde(default, skip_serializing_if = "AwsSpec::is_empty")]
    pub aws: AwsSpec,
    /// How each message is processed: declared latency, timeout, concurrency, batching, heartbeats,
    /// retries and what happens to poison messages. Required (at least `p99`).
    pub processing: ProcessingSpec,
    /// Scale-only mode: the workload that already runs your own consumer (KEDA's `scaleTargetRef`: a
    /// Deployment, a StatefulSet, or any resource with a `/scale` subresource such as an Argo
    /// Rollout), scaled through `/scale` from SQS's counts. The controller never renders or touches its
    /// pod template. Excludes `handler`, `template`, `filter` and an idempotency store (they configure
    /// the bundled `qc-worker`); without them there are no heartbeats, no outage breaker, no drain on
    /// scale-in and no observed P99 (condition `ScaleOnly` says so). Default: none (the bundled worker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_target_ref: Option<ScaleTargetRef>,
    /// What handles a message: exactly one of `http` (a server in the pod) or `exec` (a command per
    /// message). Required, unless `scaleTargetRef` is set (scale-only mode, where it is refused).
    #[serde(default, skip_serializing_if = "HandlerSpec::is_unset")]
    pub handler: HandlerSpec,
    /// De-duplication of redelivered messages (SQS delivers at least once). Default: no store.
    #[serde(default)]
    pub idempotency: IdempotencySpec,
    /// Lambda's event filtering: a message that matches none of `patterns` is DELETED without a
    /// handler call. Default: none (every message is handled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterSpec>,
    /// Pod template of the user's containers (the handler); the controller adds the `qc-worker`
    /// container. Set `spec.serviceAccountName` to the account whose IAM role may use the queue.
    /// Default: empty (no container: the QueueConsumer is reported as invalid). Refused with
    /// `scaleTargetRef`.
    #[serde(default, skip_serializing_if = "template_is_unset")]
    #[schemars(schema_with = "pod_template_schema")]
    pub template: PodTemplateSpec,
    /// Stop consuming: true scales the worker Deployment to 0 replicas (pods finish what they hold and
    /// exit through the normal SIGTERM drain) and pauses the scaler; `ScalingActive` is False with reason
    /// `Suspended` and `Ready` stays True. false resumes normal scaling at the next poll. Default: false.
    #[serde(default)]
    pub suspend: bool,
    /// Autoscaling of the worker Deployment from the queue's visible and in-flight counts. Default:
    /// 0 to 20 replicas, backlog drained within 1m.
    #[serde(default)]
    pub scaling: ScalingSpec,
    /// Dead-letter queue monitoring. Default: a CloudWatch alarm on the DLQ.
    #[serde(default)]
    pub dead_letter: DeadLetterSpec,
    /// How rule findings (status.findings) affect rollout. Default: reported only.
    #[serde(default)]
    pub validation: ValidationSpec,
    /// The `qc-worker` container the controller adds. Default: requests cpu 50m, memory 32Mi; limits
    /// memory 128Mi.
    #[serde(default)]
    pub worker: WorkerSpec,
}

/// Kubernetes knows the integer formats `int32` and `int64` only: the API server warns
/// `unrecognized format "uint32"` on a CRD that uses schemars' unsigned formats. Per the Kubernetes API
/// conventions an unsigned Rust integer becomes a plain `integer` bounded by `minimum`/`maximum`, so the
/// API server rejects exactly the values the Rust type cannot hold (and `kubectl explain` shows the range).
fn kubernetes_integers(schema: &mut Schema) {
    let Some(obj) = schema.as_object_mut() else {
        return;
    };
    let type_max: u64 = match obj.get("format").and_then(serde_json::Value::as_str) {
        Some("uint8") => u8::MAX.into(),
        Some("uint16") => u16::MAX.into(),
        Some("uint32") => u32::MAX.into(),
        Some("uint64" | "uint") => u64::MAX,
        _ => return,
    };
    obj.remove("format");
    let declared_min = obj.get("minimum").and_then(serde_json::Value::as_f64);
    if declared_min.is_none_or(|m| m < 0.0) {
        obj.insert("minimum".into(), 0.into());
    }
    let declared_max = obj.get("maximum").and_then(serde_json::Value::as_f64);
    if declared_max.is_none_or(|m| m > type_max as f64) {
        obj.insert("maximum".into(), type_max.into());
    }
}

/// The pod template is kept open in the CRD schema: the full PodTemplateSpec schema would push the CRD
/// past the 256 KiB annotation limit of client-side `kubectl apply`. The rendered Deployment is validated
/// by the API server when the controller applies it, and `check`/`plan` parse it as a PodTemplateSpec.
///
/// Only `spec.containers` is declared (its items stay open), for the one rule the API server can apply
/// here as `check` does: a template that has a pod spec lists at least one container. A manifest without
/// a template, or with only its metadata, is left to the controller (ConfigValid=False,
/// NoHandlerContainer), as `check` leaves it to the rules.
fn pod_template_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "description": "PodTemplateSpec of the user's containers (the handler); the controller adds the qc-worker container. Set spec.serviceAccountName to the account whose IAM role may use the queue. Default: empty (no container: the QueueConsumer is reported as invalid).",
        "properties": {
            "spec": {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": true,
                "description": "PodSpec of the worker pods (Kubernetes' own fields); the controller adds the qc-worker container to it.",
                "properties": {
                    "containers": {
                        "type": "array",
                        "description": "The user's containers: at least one, the handler (the exec handler runs in the first); at most 64.",
                        "maxItems": 64,
                        "items": user_container_schema()
                    },
                    "initContainers": {
                        "type": "array",
                        "description": "The user's init containers, if any (Kubernetes' own fields); at most 64.",
                        "maxItems": 64,
                        "items": user_container_schema()
                    },
                    "volumes": {
                        "type": "array",
                        "description": "The pod's volumes (Kubernetes' own fields); qc-worker-bin and qc-rate-share are the worker's; at most 256.",
                        "maxItems": 256,
                        "items": named_item_schema(
                            "The volume's name (a DNS label); qc-worker-bin and qc-rate-share are the worker's.",
                            63,
                            "!has(self.name) || (self.name != 'qc-worker-bin' && self.name != 'qc-rate-share')",
                            "the volume names qc-worker-bin and qc-rate-share are reserved for the worker: rename this volume"
                        )
                    }
                },
                "x-kubernetes-validations": [{
                    "rule": "has(self.containers) && size(self.containers) > 0",
                    "message": "template.spec.containers lists no container: add the handler's container (with handler.http the one serving it, with handler.exec the one whose image holds the command), e.g. [{name: app, image: shop/orders:1}]; the controller adds the qc-worker container",
                    "reason": "FieldValueRequired"
                }]
            }
        }
    })
}

/// A container of the pod template: open, but for the names render's `check_reserved_names` keeps for
/// the worker: the container's own, its volume mounts' (the worker binary's volume) and its ports' (the
/// metrics port). Each length cap is Kubernetes' own for that name (a DNS label, an IANA service name);
/// with the lists' caps (64 containers, 256 volumes, mounts or ports: far beyond any real pod) they keep
/// the rules' cost estimates within the API server's budget for a CRD.
fn user_container_schema() -> serde_json::Value {
    let mut c = named_item_schema(
        "The container's name (a DNS label); qc-worker and qc-worker-install are the worker's.",
        63,
        "!has(self.name) || (self.name != 'qc-worker' && self.name != 'qc-worker-install')",
        "the container names qc-worker and qc-worker-install are reserved for the worker: rename this container",
    );
    c["properties"]["volumeMounts"] = serde_json::json!({
        "type": "array",
        "description": "The container's volume mounts (Kubernetes' own fields); only the worker mounts qc-worker-bin; at most 256.",
        "maxItems": 256,
        "items": named_item_schema(
            "The name of the volume mounted.",
            63,
            "!has(self.name) || self.name != 'qc-worker-bin'",
            "qc-worker-bin is the worker binary's volume: only the worker may mount it; remove this mount"
        )
    });
    c["properties"]["ports"] = serde_json::json!({
        "type": "array",
        "description": "The container's ports (Kubernetes' own fields); the port name qc-metrics is the worker's; at most 256.",
        "maxItems": 256,
        "items": named_item_schema(
            "The port's name (an IANA service name).",
            15,
            "!has(self.name) || self.name != 'qc-metrics'",
            "the port name qc-metrics is reserved for the worker's metrics port: rename this port"
        )
    });
    c
}

/// An open object of the pod template whose `name` (declared, capped at `max`) must pass `rule`.
fn named_item_schema(description: &str, max: u32, rule: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "properties": {
            "name": {"type": "string", "maxLength": max, "description": description}
        },
        "x-kubernetes-validations": [{"rule": rule, "message": message, "reason": "FieldValueInvalid"}]
    })
}

// The CEL rules below hold the patterns: a queue URL or endpoint is http(s), then printable ASCII
// without spaces (no CR, LF or tab that could split a header or a log line); a region is `us-east-1`,
// `us-gov-west-1`, `cn-north-1`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.url.matches('^https?://[!-~]+$')").message("queue.url must be an http(s) URL of printable characters without spaces, CR or LF, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/orders").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.region) || self.region.matches('^[a-z]{2}(-[a-z]+)+-[0-9]+$')").message("queue.region must be an AWS region such as us-east-1 (or leave it out: it is read from the URL)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.endpoint) || self.endpoint.matches('^https?://[!-~]+$')").message("queue.endpoint must be an http(s) URL of printable characters without spaces, CR or LF, e.g. http://localhost:4566 (leave it out on AWS)").reason(Reason::FieldValueInvalid))]
pub struct QueueSpec {
    /// Queue URL, e.g. https://sqs.us-east-1.amazonaws.com/123456789012/orders. Required.
    #[schemars(length(min = 1, max = 1024))]
    pub url: String,
    /// AWS region, e.g. us-east-1. Default: read from the URL (sqs.REGION.amazonaws.com).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    pub region: Option<String>,
    /// Endpoint URL override for local emulators, e.g. http://localmock:4566; never needed on AWS.
    /// The controller honours it only when its operator allows it (chart value
    /// `aws.allowedEndpoints`); otherwise ConfigValid is False with reason EndpointNotAllowed and no
    /// request is sent. Default: none (the region's SQS endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub endpoint: Option<String>,
    /// Whether the controller sets the queue's settings from this spec (docs/manage.md). `off` (the
    /// default): it only reads them and reports findings. `attributes`: it raises VisibilityTimeout,
    /// the RedrivePolicy's maxReceiveCount and MessageRetentionPeriod to what its rules recommend
    /// (SetQueueAttributes; never lowers any of them) and corrects drift on later polls. `create`: as
    /// `attributes`, and it also creates the queue and its dead-letter queue when missing (SSE-SQS,
    /// tagged with this QueueConsumer; never deleted). Never while `suspend` is true, nor for a queue
    /// another QueueConsumer manages with different values (QueueManaged=False, ManageConflict).
    #[serde(default, skip_serializing_if = "QueueManage::is_off")]
    pub manage: QueueManage,
}

/// What the controller may change on the queue (`spec.queue.manage`), in increasing order of what it
/// does (a tenancy rule's `manage` is the most its namespaces may ask for).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum QueueManage {
    /// Read only: findings name what to change, the user changes it.
    #[default]
    Off,
    /// Raise VisibilityTimeout, maxReceiveCount and MessageRetentionPeriod to what the rules recommend.
    Attributes,
    /// As `attributes`, and create the queue and its dead-letter queue when they are missing.
    Create,
}

impl QueueManage {
    pub fn is_off(&self) -> bool {
        *self == QueueManage::Off
    }

    /// The spelling in the spec.
    pub fn as_str(&self) -> &'static str {
        match self {
            QueueManage::Off => "off",
            QueueManage::Attributes => "attributes",
            QueueManage::Create => "create",
        }
    }
}

/// The AWS identity of one QueueConsumer's calls.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!has(self.roleArn) || self.roleArn.matches('^arn:aws(-[a-z]+)*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]+$')").message("aws.roleArn must be an IAM role ARN such as arn:aws:iam::123456789012:role/orders-consumer").reason(Reason::FieldValueInvalid))]
pub struct AwsSpec {
    /// IAM role the controller assumes (STS AssumeRole, session `qc-NAMESPACE.NAME`, ExternalId
    /// `qc:NAMESPACE`) for every AWS call it makes for this QueueConsumer, and the worker assumes from
    /// its pod identity. The operator's tenancy policy may require it and limits which roles a namespace
    /// may name. Default: none (the controller's and the pods' own identities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub role_arn: Option<String>,
}

impl AwsSpec {
    pub fn is_empty(&self) -> bool {
        self.role_arn.is_none()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new(duration::when_durations(&["p99", "timeout"], "duration(self.p99) <= duration(self.timeout)")).message("processing.p99 must not exceed processing.timeout: raise timeout or lower p99").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new(duration::when_durations(&["waitTime"], "duration(self.waitTime) <= duration('20s')")).message("processing.waitTime must be at most 20s (the SQS long-poll maximum)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.batchSize >= 1 && self.batchSize <= 10").message("processing.batchSize must be between 1 and 10 (SQS MaxNumberOfMessages)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.concurrency >= 1").message("processing.concurrency must be at least 1").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.maxRate) || (self.maxRate >= 1 && self.maxRate <= 1000000)").message("processing.maxRate must be a whole number of messages per second from 1 to 1000000 (leave it out for no limit)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.concurrency <= 10000").message("processing.concurrency must be at most 10000 (the worker's limit: each slot holds a message and its buffers); add replicas instead").reason(Reason::FieldValueInvalid))]
pub struct ProcessingSpec {
    /// Declared P99 time to handle ONE message, a duration such as 2s (units ms, s, m, h). Sizes
    /// scaling and the visibility-timeout rules. Required.
    pub p99: Duration,
    /// Declared mean time to handle one message, a duration such as 500ms; enables the 6x-mean rule
    /// and mean-sized scaling of the seen backlog. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean: Option<Duration>,
    /// Hard per-message handler timeout, a duration (e.g. 30s): a handler still running is abandoned
    /// and the message retried. Default: 30s.
    #[serde(default = "defaults::timeout")]
    pub timeout: Duration,
    /// Messages handled at once per replica (a count, at least 1). Default: 10.
    #[serde(default = "defaults::concurrency")]
    #[schemars(range(min = 1, max = MAX_CONCURRENCY))]
    pub concurrency: u32,
    /// Messages asked for per ReceiveMessage call (SQS MaxNumberOfMessages, 1 to 10). Default: 10.
    #[serde(default = "defaults::batch_size")]
    #[schemars(range(min = 1, max = 10))]
    pub batch_size: u32,
    /// Long-poll wait of each ReceiveMessage (SQS WaitTimeSeconds), a duration from 0s to 20s; 0s is
    /// short polling (more empty receives). Default: 20s.
    #[serde(default = "defaults::wait_time")]
    pub wait_time: Duration,
    /// Per-message visibility extension (ChangeMessageVisibility) while a handler runs: first one
    /// visibility timeout at `interval` after the receive, then each extension twice the one before
    /// (up to processing.timeout, at most 15m), its beat at the same fraction of the new lease; after
    /// a crash a message returns within max(visibility timeout, VT/interval × the time it was held).
    /// Default: enabled, interval a third of the visibility timeout.
    #[serde(default)]
    pub heartbeat: HeartbeatSpec,
    /// Backoff of transient failures, applied with ChangeMessageVisibility: base × 2^(receives−1),
    /// capped at max. Default: 5s base, 15m max.
    #[serde(default)]
    pub retry_backoff: RetryBackoffSpec,
    /// What happens to a message the handler reports as poison (HTTP 400/422, exit code 65):
    /// deadLetter sends it to the redrive policy's DLQ now, leave lets the redrive policy move it,
    /// delete drops it. Default: deadLetter.
    #[serde(default)]
    pub on_poison: OnPoison,
    /// How long a dependency may be down before messages go to the DLQ, a duration such as 1h: after
    /// the outage breaker has been open this long, the worker stops holding messages and they follow
    /// the normal retries toward the DLQ; also checked against maxReceiveCount × visibility timeout.
    /// Default: none (held up to SQS's 12h visibility limit; not checked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outage_tolerance: Option<Duration>,
    /// The outage breaker: when the handler's transient failures (timeouts, no connection, HTTP 5xx
    /// and 429, exec exits other than 0 and 65) show its own dependency is down, each worker pauses
    /// receiving, keeps the messages it holds under their heartbeats and probes the handler with one
    /// of them, instead of burning their receives toward the DLQ; a successful probe closes it
    /// gradually. Poison answers never count. HandlerHealthy in status shows it. Default: enabled,
    /// opens at 50% failures of the last 20 outcomes or 10 in a row, probes 1s doubling to 30s.
    #[serde(default)]
    pub breaker: BreakerSpec,
    /// Most messages per second started across all replicas together, a whole number from 1 to
    /// 1000000 (e.g. 200 for a downstream API allowed 200 calls a second). Each worker pod takes its
    /// share (maxRate / replicas, from the controller through a pod annotation, without a restart) and
    /// paces its receives with a token bucket; in batch mode messages count, not handler calls. The
    /// scaler adds no replica the rate cannot use (ScalingActive reason AtMaxRate). Default: none
    /// (unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_RATE))]
    pub max_rate: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.failurePercent >= 1 && self.failurePercent <= 100").message("processing.breaker.failurePercent must be between 1 and 100 (a percentage of the window's outcomes)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.window >= 2 && self.window <= 1000").message("processing.breaker.window must be between 2 and 1000 outcomes").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.consecutiveFailures >= 1 && self.consecutiveFailures <= 1000").message("processing.breaker.consecutiveFailures must be between 1 and 1000").reason(Reason::FieldValueInvalid))]
pub struct BreakerSpec {
    /// Pause intake while the handler's dependency fails (true), or let every message fail, retry
    /// and reach the DLQ after maxReceiveCount receives (false). Default: true.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// Opens when at least this percentage of the last `window` outcomes were transient failures
    /// (1 to 100). Default: 50.
    #[serde(default = "defaults::breaker_failure_percent")]
    #[schemars(range(min = 1, max = 100))]
    pub failure_percent: u32,
    /// Outcomes the percentage is taken over (2 to 1000); it applies once the window holds this many.
    /// Default: 20.
    #[serde(default = "defaults::breaker_window")]
    #[schemars(range(min = 2, max = 1000))]
    pub window: u32,
    /// Opens after this many transient failures in a row, for low traffic where the window fills
    /// slowly (1 to 1000). Default: 10.
    #[serde(default = "defaults::breaker_consecutive")]
    #[schemars(range(min = 1, max = 1000))]
    pub consecutive_failures: u32,
    /// Delay between probes while open: base doubling per failed probe up to max, jittered.
    /// Default: 1s base, 30s max.
    #[serde(default)]
    pub probe_backoff: ProbeBackoffSpec,
}

impl Default for BreakerSpec {
    fn default() -> Self {
        BreakerSpec {
            enabled: true,
            failure_percent: defaults::breaker_failure_percent(),
            window: defaults::breaker_window(),
            consecutive_failures: defaults::breaker_consecutive(),
            probe_backoff: ProbeBackoffSpec::default(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new(duration::when_durations(&["base", "max"], "duration(self.base) <= duration(self.max)")).message("processing.breaker.probeBackoff.base must not exceed probeBackoff.max: lower base or raise max").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new(duration::when_durations(&["base"], "duration(self.base) >= duration('100ms')")).message("processing.breaker.probeBackoff.base must be at least 100ms: a faster probe hammers the failing dependency the breaker protects").reason(Reason::FieldValueInvalid))]
pub struct ProbeBackoffSpec {
    /// Delay before the first probe after the breaker opens, a duration (at least 100ms); doubled
    /// after each failed probe. Default: 1s.
    #[serde(default = "defaults::breaker_probe_base")]
    pub base: Duration,
    /// Longest delay between probes, a duration (at least base). Default: 30s.
    #[serde(default = "defaults::breaker_probe_max")]
    pub max: Duration,
}

impl Default for ProbeBackoffSpec {
    fn default() -> Self {
        ProbeBackoffSpec {
            base: defaults::breaker_probe_base(),
            max: defaults::breaker_probe_max(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HeartbeatSpec {
    /// Extend the visibility of each in-flight message while its handler runs. Default: true.
    #[serde(default = "defaults::yes")]
    pub enabled: bool,
    /// When the first extension falls due after the receive (later ones spread out as extensions
    /// grow): `auto` (a third of the queue's visibility timeout) or a duration such as 10s.
    /// Default: auto.
    #[serde(default)]
    pub interval: HeartbeatInterval,
}

impl Default for HeartbeatSpec {
    fn default() -> Self {
        HeartbeatSpec {
            enabled: true,
            interval: HeartbeatInterval::Auto,
        }
    }
}

/// Heartbeat interval: `auto` = VT/3, or a fixed duration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeartbeatInterval {
    #[default]
    Auto,
    Fixed(Duration),
}

impl HeartbeatInterval {
    /// The interval for a queue with visibility timeout `vt`.
    pub fn resolve(&self, vt: Duration) -> Duration {
        match self {
            HeartbeatInterval::Auto => Duration::from_millis(vt.as_millis_u64() / 3),
            HeartbeatInterval::Fixed(d) => *d,
        }
    }
}

impl fmt::Display for HeartbeatInterval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HeartbeatInterval::Auto => f.write_str("auto"),
            HeartbeatInterval::Fixed(d) => d.fmt(f),
        }
    }
}

impl FromStr for HeartbeatInterval {
    type Err = DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.trim() == "auto" {
            Ok(HeartbeatInterval::Auto)
        } else {
            s.parse().map(HeartbeatInterval::Fixed)
        }
    }
}

string_form!(HeartbeatInterval, {
    "type": "string",
    "maxLength": 32,
    "description": "When the first extension falls due after the receive (later ones spread out as extensions grow): auto (a third of the visibility timeout) or a duration such as 10s or 2.5s (units ms, s, m, h). Default: auto.",
    "x-kubernetes-validations": duration::duration_rule(AUTO_OR_DURATION_PATTERN, "auto or a duration")
});

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RetryBackoffSpec {
    /// Delay before the first retry, a duration; doubled per receive. Default: 5s.
    #[serde(default = "defaults::retry_base")]
    pub base: Duration,
    /// Longest delay between retries, a duration (SQS caps visibility at 12h). Default: 15m.
    #[serde(default = "defaults::retry_max")]
    pub max: Duration,
}

impl Default for RetryBackoffSpec {
    fn default() -> Self {
        RetryBackoffSpec {
            base: defaults::retry_base(),
            max: defaults::retry_max(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnPoison {
    /// Send poison messages to the redrive policy's DLQ at once (body, attributes, FIFO group and a
    /// `qc-poison-reason` attribute), then delete them from the source; without a DLQ, act as `leave`.
    #[default]
    DeadLetter,
    /// Leave them so the redrive policy moves them to the DLQ after maxReceiveCount receives.
    Leave,
    /// Delete poison messages: they are gone, only a log line remains (opt-in).
    Delete,
}

impl OnPoison {
    /// The worker's `--on-poison` spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            OnPoison::DeadLetter => "dead-letter",
            OnPoison::Leave => "leave",
            OnPoison::Delete => "delete",
        }
    }
}

impl FromStr for OnPoison {
    type Err = String;
    /// The `--on-poison` flag: `dead-letter`, `leave` or `delete` (the CRD's `deadLetter` too).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "dead-letter" | "deadLetter" => Ok(OnPoison::DeadLetter),
            "leave" => Ok(OnPoison::Leave),
            "delete" => Ok(OnPoison::Delete),
            _ => Err(format!("{s:?}: use dead-letter, leave or delete")),
        }
    }
}

/// `spec.scaleTargetRef`: the workload scale-only mode scales (KEDA's field of that name).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScaleTargetRef {
    /// The target's API group and version. Default: apps/v1.
    #[serde(default = "defaults::scale_api_version")]
    #[schemars(
        regex(
            pattern = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?v[0-9]+((alpha|beta)[0-9]+)?$"
        ),
        length(max = 316)
    )]
    pub api_version: String,
    /// The target's kind, with a `/scale` subresource: Deployment, StatefulSet, Rollout (Argo
    /// Rollouts, apiVersion argoproj.io/v1alpha1)... Default: Deployment.
    #[serde(default = "defaults::scale_kind")]
    #[schemars(regex(pattern = r"^[A-Z][A-Za-z0-9]*$"), length(max = 63))]
    pub kind: String,
    /// The target's name, in the QueueConsumer's namespace. Required.
    #[schemars(
        regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
        length(min = 1, max = 253)
    )]
    pub name: String,
}

impl ScaleTargetRef {
    /// What the CRD's patterns refuse, for `check` (whose CEL validator runs no patterns): (field, message).
    pub fn errors(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        let dns_label = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !s.starts_with('-')
                && !s.ends_with('-')
        };
        let name_ok = self.name.len() <= 253 && self.name.split('.').all(dns_label);
        if !name_ok {
            out.push((
                "spec.scaleTargetRef.name",
                format!(
                    "{:?} is not a Kubernetes object name: lowercase letters, digits, '-' and '.', e.g. orders-consumer",
                    self.name
                ),
            ));
        }
        let kind_ok = self.kind.len() <= 63
            && self.kind.starts_with(|c: char| c.is_ascii_uppercase())
            && self.kind.chars().all(|c| c.is_ascii_alphanumeric());
        if !kind_ok {
            out.push((
                "spec.scaleTargetRef.kind",
                format!(
                    "{:?} is not a kind: CamelCase as the API names it, e.g. Deployment, StatefulSet or Rollout",
                    self.kind
                ),
            ));
        }
        let (group, version) = self
            .api_version
            .rsplit_once('/')
            .unwrap_or(("", &self.api_version));
        let version_ok = version.strip_prefix('v').is_some_and(|rest| {
            let digits = rest.trim_start_matches(|c: char| c.is_ascii_digit());
            rest.len() > digits.len()
                && (digits.is_empty()
                    || ["alpha", "beta"].iter().any(|p| {
                        digits
                            .strip_prefix(p)
                            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
                    }))
        });
        let group_ok = !self.api_version.contains('/') || group.split('.').all(dns_label);
        if !(version_ok && group_ok) || self.api_version.len() > 316 {
            out.push((
                "spec.scaleTargetRef.apiVersion",
                format!(
                    "{:?} is not an API version: group/version, e.g. apps/v1 or argoproj.io/v1alpha1",
                    self.api_version
                ),
            ));
        }
        out
    }

    /// `Kind/name` (`Deployment/orders`), as status and Events name it.
    pub fn describe(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }

    /// The command that opts the target in for QueueConsumer `consumer` ([`SCALED_BY_ANNOTATION`]):
    /// `kubectl annotate -n shop deployment.apps/orders sqs.consumers.dev/scaled-by=orders`.
    pub fn opt_in_command(&self, namespace: Option<&str>, consumer: &str) -> String {
        let kind = self.kind.to_lowercase();
        let resource = match self.api_version.rsplit_once('/') {
            Some((group, _)) if !group.is_empty() => format!("{kind}.{group}"),
            _ => kind,
        };
        let ns = namespace.map(|n| format!("-n {n} ")).unwrap_or_default();
        format!(
            "kubectl annotate {ns}{resource}/{} {SCALED_BY_ANNOTATION}={consumer}",
            self.name
        )
    }
}

/// How a QueueConsumer consumes: through the bundled worker, or by scaling the user's own consumer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode<'a> {
    /// `handler` and `template`: the controller renders the worker Deployment with `qc-worker`.
    Worker,
    /// `scaleTargetRef`: the controller only scales this target through `/scale`.
    ScaleOnly(&'a ScaleTargetRef),
}

impl QueueConsumerSpec {
    pub fn mode(&self) -> Mode<'_> {
        match &self.scale_target_ref {
            Some(t) => Mode::ScaleOnly(t),
            None => Mode::Worker,
        }
    }

    /// What the CRD's rules refuse about the choice of mode (the controller and `check` say the same
    /// for a manifest that did not pass the API server): (field, message, fix).
    pub fn mode_conflict(&self) -> Option<(&'static str, String, &'static str)> {
        match self.mode() {
            Mode::Worker if self.handler.is_unset() => Some((
                "spec.handler",
                "spec sets neither handler nor scaleTargetRef".to_string(),
                "set handler and template to run your handler behind the bundled qc-worker, or scaleTargetRef (kind, name) to scale the Deployment that already runs your own consumer",
            )),
            Mode::Worker => None,
            Mode::ScaleOnly(t) => {
                let mut set = Vec::new();
                if !self.handler.is_unset() {
                    set.push("handler");
                }
                if !template_is_unset(&self.template) {
                    set.push("template");
                }
                if self.filter.is_some() {
                    set.push("filter");
                }
                if self.idempotency.store != IdempotencyStore::None {
                    set.push("idempotency.store");
                }
                (!set.is_empty()).then(|| {
                    (
                        "spec.scaleTargetRef",
                        format!(
                            "spec.scaleTargetRef ({}: scale-only mode) excludes {}, which configure the bundled qc-worker",
                            t.describe(),
                            set.join(", ")
                        ),
                        "remove them, or remove scaleTargetRef to run the bundled worker",
                    )
                })
            }
        }
    }
}

/// An unset template (what the bundled worker needs and scale-only mode refuses) is left out, so the
/// CRD has no default for it that scale-only mode's rule would then refuse.
fn template_is_unset(t: &PodTemplateSpec) -> bool {
    t.metadata.is_none() && t.spec.is_none()
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("has(self.http) != has(self.exec)").message("handler must set exactly one of http or exec").reason(Reason::FieldValueInvalid))]
pub struct HandlerSpec {
    /// POST each message to a server in the pod (CloudEvents binary mode); 2xx success, 400/422
    /// poison, 429/503 retry after Retry-After, anything else retry. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpHandler>,
    /// Run a command per message in your first container (qc-worker runs inside it), body on stdin;
    /// exit 0 success, 65 poison, anything else retry. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<ExecHandler>,
    /// SNS envelopes (a queue subscribed to a topic without raw message delivery): "on" gives the
    /// handler the notification's Message as the body and its MessageAttributes as attributes, and
    /// a message that is not a notification is poison; "auto" unwraps only messages that are
    /// notifications ("Type": "Notification" with a TopicArn); "off" hands every message over as
    /// received. A malformed notification is poison with the reason; the DLQ gets the envelope.
    /// Quote the value in YAML ("on", "off"). Default: "off".
    #[serde(default, skip_serializing_if = "UnwrapSns::is_off")]
    pub unwrap_sns: UnwrapSns,
    /// Batch mode: up to `maxItems` messages per handler call (HTTP: a JSON array of structured
    /// CloudEvents, `application/cloudevents-batch+json`; exec: one event per line on stdin). The
    /// answer (HTTP: the 2xx body; exec: the file `QC_BATCH_ANSWER_FILE` names, never stdout) names
    /// failed items in Lambda's shape, `{"batchItemFailures": [{"itemIdentifier": "<message
    /// id>"}]}`: those are retried, the rest deleted; `{}` or an empty list (HTTP: also an empty
    /// body) means all succeeded; an error status, a timeout, an exec exit 0 without the file or a
    /// malformed answer retries every item. `processing.concurrency` then counts calls and
    /// `processing.p99` is a whole call's. Default: none (one message a call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchSpec>,
    /// Amazon SQS Extended Client payloads: a message whose body points at an S3 object
    /// (`["software.amazon.payloadoffloading.PayloadS3Pointer", {"s3BucketName": ..., "s3Key": ...}]`)
    /// reaches the handler with the object's bytes as its body, fetched with the worker's identity.
    /// Default: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_payloads: Option<S3PayloadsSpec>,
    /// A JSON Schema (draft 2020-12 unless the schema's `$schema` names another) in a ConfigMap of
    /// the QueueConsumer's namespace: a message whose body (as the handler would get it, after SNS
    /// unwrapping and the S3 payload fetch) is not JSON or does not validate is poison, with the first
    /// validation error as its reason, before any handler call. The worker refuses to start on a
    /// schema that does not compile; remote `$ref`s are never fetched. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaSpec>,
}

/// `spec.filter`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("size(self.patterns) >= 1 && size(self.patterns) <= 10").message("filter.patterns holds 1 to 10 patterns; remove spec.filter to handle every message").reason(Reason::FieldValueInvalid))]
pub struct FilterSpec {
    /// Patterns in Lambda's FilterCriteria syntax, each a JSON object as text over the message's
    /// record (`body` parsed as JSON, `attributes`, `messageAttributes`), e.g.
    /// `{"body": {"type": ["order"]}}`: equals, prefix, suffix, equals-ignore-case, anything-but,
    /// numeric, exists, $or. A message passes when any pattern matches; one that matches none is
    /// deleted without a handler call (counted in qc_worker_messages_filtered_total). Required.
    pub patterns: Vec<String>,
}

/// `handler.schema`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchemaSpec {
    /// The ConfigMap key holding the schema (JSON), mounted read-only into the worker. Required.
    pub config_map_key_ref: ConfigMapKeyRef,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigMapKeyRef {
    /// Name of the ConfigMap, in the QueueConsumer's namespace. Required.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key within the ConfigMap. Required.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// `handler.s3Payloads`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!self.enabled || (has(self.buckets) && size(self.buckets) > 0)").message("handler.s3Payloads.buckets is required when s3Payloads is enabled: list the buckets payloads may come from, e.g. [\"{namespace}.payloads\"]; a pointer into any other bucket is poison").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("!has(self.buckets) || self.buckets.all(b, b.matches('^([a-z0-9.*?-]|[{]namespace[}])+$'))").message("handler.s3Payloads.buckets holds S3 bucket names or patterns: lowercase letters, digits, '.', '-', '*' or '?' as wildcards, and {namespace}, e.g. \"{namespace}.payloads\"").reason(Reason::FieldValueInvalid))]
pub struct S3PayloadsSpec {
    /// Fetch S3 payloads (needs s3:GetObject on the bucket); a missing object, a missing bucket and
    /// access denied are poison, an S3 outage a retry. Default: false.
    #[serde(default)]
    pub enabled: bool,
    /// The buckets payloads may come from (required when enabled): names or patterns (`*` any run
    /// of characters, `?` one, `{namespace}` this QueueConsumer's namespace). A pointer into any
    /// other bucket is poison before any S3 call; the operator's tenancy policy bounds what a
    /// namespace may list. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "buckets_schema")]
    pub buckets: Vec<String>,
    /// Delete the object once the message's delete is confirmed (needs s3:DeleteObject); an object
    /// of a message that stays on the queue is kept. Refused with `unwrapSns` (every subscriber of
    /// an SNS fan-out points at one object). Default: false.
    #[serde(default)]
    pub delete_after_processing: bool,
}

/// Most messages in one batch handler call.
pub const MAX_BATCH_ITEMS: u32 = 100;

/// `handler.batch`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.maxItems >= 1 && self.maxItems <= 100").message("handler.batch.maxItems must be between 1 and 100").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new(duration::when_durations(&["maxWait"], "duration(self.maxWait) <= duration('5m')")).message("handler.batch.maxWait must be at most 5m (waiting messages hold their leases); e.g. 1s").reason(Reason::FieldValueInvalid))]
pub struct BatchSpec {
    /// Messages per call, at most (1 to 100). Default: 10.
    #[serde(default = "defaults::batch_max_items")]
    #[schemars(range(min = 1, max = 100))]
    pub max_items: u32,
    /// A call starts with fewer messages once the oldest has waited this long, a duration (at most
    /// 5m). Default: 1s.
    #[serde(default = "defaults::batch_max_wait")]
    pub max_wait: Duration,
}

impl Default for BatchSpec {
    fn default() -> Self {
        BatchSpec {
            max_items: defaults::batch_max_items(),
            max_wait: defaults::batch_max_wait(),
        }
    }
}

/// `handler.unwrapSns`: whether the worker unwraps SNS notification envelopes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum UnwrapSns {
    #[default]
    Off,
    On,
    Auto,
}

impl UnwrapSns {
    /// The worker's `--unwrap-sns` spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            UnwrapSns::Off => "off",
            UnwrapSns::On => "on",
            UnwrapSns::Auto => "auto",
        }
    }

    // serde's skip_serializing_if passes a reference.
    #[allow(clippy::trivially_copy_pass_by_ref)]
    fn is_off(&self) -> bool {
        *self == UnwrapSns::Off
    }
}

impl FromStr for UnwrapSns {
    type Err = String;
    /// The `--unwrap-sns` flag: `off`, `on` or `auto`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "off" => Ok(UnwrapSns::Off),
            "on" => Ok(UnwrapSns::On),
            "auto" => Ok(UnwrapSns::Auto),
            _ => Err(format!("{s:?}: use off, on or auto")),
        }
    }
}

/// The handler, once exactly one was chosen.
#[derive(Clone, Debug, PartialEq)]
pub enum Handler<'a> {
    Http(&'a HttpHandler),
    Exec(&'a ExecHandler),
}

impl HandlerSpec {
    /// Nothing set: scale-only mode, or a manifest without a handler (refused by the CRD's rule).
    pub fn is_unset(&self) -> bool {
        *self == HandlerSpec::default()
    }

    /// The one handler, or None when zero or both are set (rejected by the CRD's CEL rule).
    pub fn one(&self) -> Option<Handler<'_>> {
        match (&self.http, &self.exec) {
            (Some(h), None) => Some(Handler::Http(h)),
            (None, Some(e)) => Some(Handler::Exec(e)),
            _ => None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.path.matches('^/[!-~]*$')").message("handler.http.path must start with / and hold only printable characters, without spaces, CR or LF (it goes into the request line), e.g. /messages").reason(Reason::FieldValueInvalid))]
pub struct HttpHandler {
    /// TCP port the handler listens on, on localhost in the pod (1 to 65535). Default: 8080.
    #[serde(default = "defaults::http_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// Request path, starting with /. Default: /messages.
    #[serde(default = "defaults::http_path")]
    #[schemars(regex(pattern = r"^/"), length(max = 1024))]
    pub path: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("size(self.command) == 0 || size(self.command[0]) > 0").message("handler.exec.command must name a program: its first item is the program, e.g. [\"/app/handle\"]").reason(Reason::FieldValueInvalid))]
pub struct ExecHandler {
    /// Command and arguments run per message (no shell), body on stdin, metadata in QC_* environment
    /// variables. Required.
    #[schemars(length(min = 1))]
    pub command: Vec<String>,
    /// Pass static AWS keys (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) from the
    /// container's environment on to the command. Off: the command gets the container's environment
    /// without them and without the worker's secrets (its Redis URL); a pod identity (IRSA, EKS Pod
    /// Identity) still reaches it. Default: false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pass_aws_credentials: bool,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.store != 'redis' || has(self.redis)").message("idempotency.store redis needs idempotency.redis.urlSecretRef").reason(Reason::FieldValueRequired))]
#[x_kube(validation = Rule::new("self.store != 'dynamodb' || has(self.dynamodb)").message("idempotency.store dynamodb needs idempotency.dynamodb.table, e.g. dynamodb: {table: orders-idempotency}").reason(Reason::FieldValueRequired))]
pub struct IdempotencySpec {
    /// Where handled keys are remembered: none, memory (per pod), redis or dynamodb (shared).
    /// Default: none.
    #[serde(default)]
    pub store: IdempotencyStore,
    /// What identifies a message: messageId, jsonPointer:/path/in/body or attribute:Name. Default:
    /// messageId.
    #[serde(default)]
    pub key: IdempotencyKey,
    /// How long a handled key is remembered, a duration such as 24h. Default: 24h.
    #[serde(default = "defaults::idempotency_ttl")]
    pub ttl: Duration,
    /// The redis store's connection; required when store is redis. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redis: Option<RedisSpec>,
    /// The DynamoDB store's table, called with the worker's own AWS identity (needs
    /// dynamodb:GetItem, PutItem, UpdateItem and DeleteItem on it); required when store is dynamodb.
    /// Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamodb: Option<DynamoDbSpec>,
}

impl Default for IdempotencySpec {
    fn default() -> Self {
        IdempotencySpec {
            store: IdempotencyStore::None,
            key: IdempotencyKey::MessageId,
            ttl: defaults::idempotency_ttl(),
            redis: None,
            dynamodb: None,
        }
    }
}

/// `idempotency.dynamodb`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.table.matches('^[a-zA-Z0-9_.-]{3,255}$')").message("idempotency.dynamodb.table must be a DynamoDB table name: 3 to 255 letters, digits, '_', '-' or '.'").reason(Reason::FieldValueInvalid))]
pub struct DynamoDbSpec {
    /// The table (in the queue's region). Its partition key is a String attribute named
    /// `keyAttribute`, and no sort key. Required.
    pub table: String,
    /// The partition key's attribute name. Default: id.
    #[serde(default = "defaults::dynamodb_key_attribute")]
    #[schemars(length(min = 1, max = 255))]
    pub key_attribute: String,
    /// The attribute holding each item's expiry in epoch seconds: turn on the table's TTL on it so
    /// DynamoDB removes expired keys. Default: expiresAt.
    #[serde(default = "defaults::dynamodb_ttl_attribute")]
    #[schemars(length(min = 1, max = 255))]
    pub ttl_attribute: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum IdempotencyStore {
    #[default]
    None,
    Memory,
    Redis,
    #[serde(rename = "dynamodb")]
    DynamoDb,
}

impl IdempotencyStore {
    pub fn as_str(&self) -> &'static str {
        match self {
            IdempotencyStore::None => "none",
            IdempotencyStore::Memory => "memory",
            IdempotencyStore::Redis => "redis",
            IdempotencyStore::DynamoDb => "dynamodb",
        }
    }
}

/// Where a message's idempotency key comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum IdempotencyKey {
    #[default]
    MessageId,
    /// RFC 6901 pointer into the JSON body, e.g. `/orderId`.
    JsonPointer(String),
    /// A message attribute's string value.
    Attribute(String),
}

/// Why an idempotency key string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid idempotency key {0:?}: use messageId, jsonPointer:/path/to/field or attribute:Name"
)]
pub struct IdempotencyKeyError(pub String);

impl FromStr for IdempotencyKey {
    type Err = IdempotencyKeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "messageId" {
            Ok(IdempotencyKey::MessageId)
        } else if let Some(p) = s.strip_prefix("jsonPointer:") {
            if p.starts_with('/') {
                Ok(IdempotencyKey::JsonPointer(p.to_string()))
            } else {
                Err(IdempotencyKeyError(s.to_string()))
            }
        } else if let Some(a) = s.strip_prefix("attribute:") {
            if !a.is_empty()
                && a.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
            {
                Ok(IdempotencyKey::Attribute(a.to_string()))
            } else {
                Err(IdempotencyKeyError(s.to_string()))
            }
        } else {
            Err(IdempotencyKeyError(s.to_string()))
        }
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdempotencyKey::MessageId => f.write_str("messageId"),
            IdempotencyKey::JsonPointer(p) => write!(f, "jsonPointer:{p}"),
            IdempotencyKey::Attribute(a) => write!(f, "attribute:{a}"),
        }
    }
}

string_form!(IdempotencyKey, {
    "type": "string",
    "pattern": r"^(messageId|jsonPointer:/.*|attribute:[A-Za-z0-9_.-]+)$",
    "description": "What identifies a message: messageId, jsonPointer:/path/in/body or attribute:Name. Default: messageId."
});

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedisSpec {
    /// The Secret key holding the redis URL (redis://... or rediss://...), in the QueueConsumer's
    /// namespace. Required.
    pub url_secret_ref: SecretKeyRef,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretKeyRef {
    /// Name of the Secret. Required.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key within the Secret. Required.
    #[schemars(length(min = 1))]
    pub key: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("scaling.minReplicas must not exceed scaling.maxReplicas").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.maxReplicas >= 1").message("scaling.maxReplicas must be at least 1").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("self.maxReplicas <= 2147483647").message("scaling.maxReplicas must be at most 2147483647 (a Deployment's replicas are an int32)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new(duration::when_durations(&["maxBacklogAge"], "duration(self.maxBacklogAge) > duration('0s')")).message("scaling.maxBacklogAge must be greater than 0s").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new(duration::when_durations(&["pollInterval"], "duration(self.pollInterval) >= duration('1s')")).message("scaling.pollInterval must be at least 1s").reason(Reason::FieldValueInvalid))]
pub struct ScalingSpec {
    /// Fewest worker replicas; 0 lets an idle queue scale to zero. Default: 0.
    #[serde(default)]
    #[schemars(range(max = 2_147_483_647))]
    pub min_replicas: u32,
    /// Most worker replicas (at least 1, at least minReplicas). Default: 20.
    #[serde(default = "defaults::max_replicas")]
    #[schemars(range(max = 2_147_483_647))]
    pub max_replicas: u32,
    /// Target age of the visible backlog, a duration: enough replicas to drain it within this at
    /// the declared P99. Default: 1m.
    #[serde(default = "defaults::max_backlog_age")]
    pub max_backlog_age: Duration,
    /// Count in-flight messages as work (replicas for them at `concurrency` each). Default: true.
    #[serde(default = "defaults::yes")]
    pub scale_on_in_flight: bool,
    /// From zero replicas, scale up only when more than this many messages are visible (a count).
    /// Default: 0.
    #[serde(default)]
    #[schemars(range(max = 2_147_483_647))]
    pub activation_backlog: u32,
    /// FIFO queues: how many message groups are active at once at most (a count). A group's messages
    /// are handled one at a time, so replicas × concurrency beyond the groups (plus 25 % headroom)
    /// would wait: the scaler adds no replica beyond that (limited by MessageGroups) and `check` warns
    /// when maxReplicas × concurrency exceeds it. Default: none (not capped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 2_147_483_647))]
    pub message_groups: Option<u32>,
    /// How often the queue is read (GetQueueAttributes) and replicas decided, a duration of at
    /// least 1s. Default: 15s.
    #[serde(default = "defaults::poll_interval")]
    pub poll_interval: Duration,
    /// Scale down only to the highest recommendation of this window: `auto` holds an idle replica
    /// about as long as starting one again costs, the consumer's pods' measured start-up (creation to
    /// Ready; 30s until measured), or a duration such as 5m overrides it. Default: auto.
    #[serde(default)]
    pub scale_down_stabilization: Stabilization,
    /// A service-level objective on how long a message stays in the queue, measured by the workers
    /// (SentTimestamp to deleted): condition `ObjectiveMet`, `status.objective` (observed dwell P99 and
    /// the error budget's burn rate), and the scaler sizes and holds replicas for it from the workers'
    /// measurements (docs/scaling.md, "Dwell objective"). Needs the bundled qc-worker (refused with
    /// scaleTargetRef). Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<ObjectiveSpec>,
}

/// `scaling.objective`: the dwell time 99 % of messages must stay within.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new(duration::when_durations(&["dwellP99"], "duration(self.dwellP99) > duration('0s')")).message("scaling.objective.dwellP99 must be greater than 0s: write the time 99 % of messages may take from their send to their deletion, e.g. 2m").reason(Reason::FieldValueInvalid))]
pub struct ObjectiveSpec {
    /// At most this long from a message's send (SentTimestamp) to its deletion for 99 % of the
    /// messages, a duration above processing.p99 (a message's dwell includes its handling), e.g. 2m.
    /// Required.
    pub dwell_p99: Duration,
}

impl Default for ScalingSpec {
    fn default() -> Self {
        ScalingSpec {
            min_replicas: 0,
            max_replicas: defaults::max_replicas(),
            max_backlog_age: defaults::max_backlog_age(),
            scale_on_in_flight: true,
            activation_backlog: 0,
            message_groups: None,
            poll_interval: defaults::poll_interval(),
            scale_down_stabilization: Stabilization::Auto,
            objective: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!has(self.alarmActions) || self.alarmActions.all(a, a.matches('^arn:aws(-[a-z]+)*:sns:[a-z]{2}(-[a-z]+)+-[0-9]+:[0-9]{12}:[A-Za-z0-9_-]{1,256}$'))").message("deadLetter.alarmActions must list SNS topic ARNs such as arn:aws:sns:us-east-1:123456789012:orders-alerts (standard topics: CloudWatch cannot notify FIFO topics)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.alarmActions) || size(self.alarmActions) <= 5").message("deadLetter.alarmActions takes at most 5 topics (CloudWatch's limit of actions per alarm state)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.alarmActions) || size(self.alarmActions) == 0 || self.alarm").message("deadLetter.alarmActions needs deadLetter.alarm: true (they are the alarm's actions): set alarm to true or remove alarmActions").reason(Reason::FieldValueInvalid))]
pub struct DeadLetterSpec {
    /// Manage a CloudWatch alarm on the DLQ (visible messages > 0), deleted with the QueueConsumer.
    /// Default: true.
    #[serde(default = "defaults::yes")]
    pub alarm: bool,
    /// SNS topics the alarm notifies when the DLQ receives messages (the
    /// alarm's actions; at most 5, standard topics in the queue's region), e.g.
    /// arn:aws:sns:us-east-1:123456789012:orders-alerts. Default: none (the alarm only shows its state).
    #[serde(default)]
    #[schemars(schema_with = "alarm_actions_schema")]
    pub alarm_actions: Vec<String>,
    /// Opt-in: move the messages dead-lettered for a transient cause (no `qc-poison-reason`: the
    /// redrive policy moved them after maxReceiveCount receives, e.g. handler timeouts or an outage
    /// longer than outageTolerance) back to the source once HandlerHealthy has been True for
    /// `healthyFor`; never poison. Default: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive_after_recovery: Option<RedriveAfterRecoverySpec>,
}

/// A `qc-poison-reason` and how many of the DLQ's peeked messages carry it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReasonCount {
    /// The `qc-poison-reason` (cut at 200 characters, control characters escaped), `(none)` for messages
    /// without one, `(other)` for the reasons beyond the top 5.
    pub reason: String,
    /// Messages of the peek carrying it.
    pub count: i64,
}

/// `deadLetter.redriveAfterRecovery`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedriveAfterRecoverySpec {
    /// Turn it on. Default: false.
    #[serde(default)]
    pub enabled: bool,
    /// How long HandlerHealthy must have been True (since its last transition) before the move
    /// starts, a duration such as 10m. Default: 10m.
    #[serde(default = "defaults::recovery_healthy_for")]
    pub healthy_for: Duration,
    /// Messages moved per second (1 to 500). Default: 10.
    #[serde(default = "defaults::recovery_rate")]
    #[schemars(range(min = 1, max = 500))]
    pub rate: u32,
}

impl Default for RedriveAfterRecoverySpec {
    fn default() -> Self {
        RedriveAfterRecoverySpec {
            enabled: false,
            healthy_for: defaults::recovery_healthy_for(),
            rate: defaults::recovery_rate(),
        }
    }
}

/// S3 bucket names or patterns; bounded, as `alarm_actions_schema`, so the CEL rules stay cheap.
fn buckets_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 20,
        "items": {"type": "string", "maxLength": 255},
        "description": "The buckets payloads may come from (required when enabled; at most 20): names or patterns (`*` any run of characters, `?` one, `{namespace}` this QueueConsumer's namespace). A pointer into any other bucket is poison before any S3 call; the operator's tenancy policy bounds what a namespace may list. Default: none."
    })
}

/// SNS topic ARNs. The bounds keep the CEL rules above cheap for the API server; the rules say what is
/// wrong (they are what `check` evaluates too).
fn alarm_actions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 5,
        "default": [],
        "items": {"type": "string", "maxLength": 1024},
        "description": "SNS topics the alarm notifies when the DLQ receives messages (the alarm's actions; at most 5, standard topics in the queue's region), e.g. arn:aws:sns:us-east-1:123456789012:orders-alerts. Default: none (the alarm only shows its state)."
    })
}

impl Default for DeadLetterSpec {
    fn default() -> Self {
        DeadLetterSpec {
            alarm: true,
            alarm_actions: Vec::new(),
            redrive_after_recovery: None,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValidationSpec {
    /// true: an Error finding blocks rollout (Deployment and replicas held); false: findings are only
    /// reported. Default: false.
    #[serde(default)]
    pub enforce: bool,
}

/// Messages one replica may handle at once, at most: every slot holds a message, a task and buffers.
/// `qc-worker --concurrency` has the same bound (`worker::MAX_CONCURRENCY` is this constant), so a
/// spec the API server admits never makes a worker that refuses to start.
pub const MAX_CONCURRENCY: u32 = 10_000;
/// The highest `processing.maxRate` (messages per second across all replicas): a million a second is
/// beyond what any one SQS queue is consumed at; the bound keeps the shares' arithmetic finite.
pub const MAX_RATE: u32 = 1_000_000;

/// The `qc-worker` container: its resources, so namespaces with a ResourceQuota admit the pods.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerSpec {
    /// Requests and limits of the `qc-worker` container (and of the exec layout's `qc-worker-install`
    /// init container). Default: requests cpu 50m, memory 32Mi; limits memory 128Mi. Setting it
    /// replaces the default as a whole.
    #[serde(default)]
    pub resources: WorkerResources,
    /// Spans of every message (receive, wait for a slot, handler call, delete / retry / dead-letter)
    /// exported over OTLP/HTTP (docs/worker.md, "Tracing"). Default: the operator's default for
    /// workers (chart values `tracing.*`), which is off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracing: Option<WorkerTracing>,
}

/// `spec.worker.tracing`: the worker's spans; each field left out takes the operator's default
/// (chart values `tracing.workers`, `tracing.otlp.endpoint`, `tracing.sampling`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[x_kube(validation = Rule::new("!has(self.endpoint) || self.endpoint.matches('^http://[!-~]+$')").message("worker.tracing.endpoint must be the collector's OTLP/HTTP base URL over plain http, e.g. http://otel-collector.observability:4318 (a collector forwards over TLS if needed)").reason(Reason::FieldValueInvalid))]
#[x_kube(validation = Rule::new("!has(self.sampling) || self.sampling.matches('^(100([.]0{1,4})?|[0-9]{1,2}([.][0-9]{1,4})?)%$')").message("worker.tracing.sampling must be a percentage from 0% to 100%, e.g. 1% or 0.1%").reason(Reason::FieldValueInvalid))]
pub struct WorkerTracing {
    /// true: the worker exports spans; false: it does not, whatever the operator's default.
    /// Default: the operator's default for workers (chart value `tracing.workers`, false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// The collector's OTLP/HTTP base URL (`/v1/traces` is added), e.g.
    /// http://otel-collector.observability:4318. Default: the operator's (chart value
    /// `tracing.otlp.endpoint`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub endpoint: Option<String>,
    /// The share of messages traced, as a percentage: 1%, 0.1%, 100%. A message whose producer sent
    /// its own trace context follows the producer's decision instead. Default: the operator's (chart
    /// value `tracing.sampling`, 1%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 9))]
    pub sampling: Option<String>,
}

/// A `sampling` percentage (`1%`, `0.1%`, `100%`) as a ratio from 0 to 1; the error names what is
/// wrong. Up to four decimals, at most 100 %.
pub fn sampling_ratio(s: &str) -> Result<f64, String> {
    let bad = || format!("{s:?} is not a percentage from 0% to 100% (e.g. 1% or 0.1%)");
    let number = s.strip_suffix('%').ok_or_else(bad)?;
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty()
        || whole.len() > 3
        || !digits(whole)
        || !digits(frac)
        || frac.len() > 4
        || (number.contains('.') && frac.is_empty())
    {
        return Err(bad());
    }
    let pct: f64 = number.parse().map_err(|_| bad())?;
    if pct > 100.0 {
        return Err(bad());
    }
    Ok(pct / 100.0)
}

/// Requests and limits of cpu, memory and ephemeral storage.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerResources {
    /// What the scheduler reserves for the container (cpu, memory, ephemeral-storage). Default
    /// (with `resources` left out): cpu 50m, memory 32Mi; none when `resources` is set without it.
    #[serde(default, skip_serializing_if = "ResourceAmounts::is_empty")]
    pub requests: ResourceAmounts,
    /// The most the container may use (memory over the limit is killed, cpu is throttled). Default
    /// (with `resources` left out): memory 128Mi, no cpu limit; none when `resources` is set without it.
    #[serde(default, skip_serializing_if = "ResourceAmounts::is_empty")]
    pub limits: ResourceAmounts,
}

impl Default for WorkerResources {
    fn default() -> Self {
        let q = |s: &str| Some(Quantity(s.to_string()));
        WorkerResources {
            requests: ResourceAmounts {
                cpu: q("50m"),
                memory: q("32Mi"),
                ephemeral_storage: None,
            },
            limits: ResourceAmounts {
                cpu: None,
                memory: q("128Mi"),
                ephemeral_storage: None,
            },
        }
    }
}

/// Amounts in Kubernetes quantity notation (`50m`, `0.5`, `128Mi`, `1G`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceAmounts {
    /// CPU, a Kubernetes quantity in cores, e.g. 50m or 0.5. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "quantity_schema")]
    pub cpu: Option<Quantity>,
    /// Memory, a Kubernetes quantity in bytes, e.g. 32Mi or 1G. Default: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "quantity_schema")]
    pub memory: Option<Quantity>,
    /// Local ephemeral storage (writable layer, emptyDir, logs), a Kubernetes quantity, e.g. 1Gi.
    /// Default: none.
    #[serde(
        default,
        rename = "ephemeral-storage",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(schema_with = "quantity_schema")]
    pub ephemeral_storage: Option<Quantity>,
}

impl ResourceAmounts {
    pub fn is_empty(&self) -> bool {
        self.cpu.is_none() && self.memory.is_none() && self.ephemeral_storage.is_none()
    }

    /// (name, amount) of the amounts set, with Kubernetes' resource names.
    pub fn entries(&self) -> Vec<(&'static str, &Quantity)> {
        [
            ("cpu", self.cpu.as_ref()),
            ("memory", self.memory.as_ref()),
            ("ephemeral-storage", self.ephemeral_storage.as_ref()),
        ]
        .into_iter()
        .filter_map(|(k, v)| Some((k, v?)))
        .collect()
    }
}

/// A quantity is an integer or a string, as in Kubernetes' own schemas (without their page-long
/// description); its grammar is checked by `is_quantity` (`check`, render) and, through the pattern,
/// by the API server.
fn quantity_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "x-kubernetes-int-or-string": true,
        "anyOf": [{"type": "integer"}, {"type": "string"}],
        "pattern": QUANTITY_PATTERN,
        "description": "Kubernetes quantity, e.g. 50m, 0.5, 128Mi."
    })
}

/// Kubernetes' quantity grammar as a pattern (applied to strings only): sign, decimal number, then a
/// binary suffix (Ki..Ei), a decimal one (n, u, m, k, M..E) or a decimal exponent.
pub const QUANTITY_PATTERN: &str =
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]+))?$";

/// Observed state, written by the controller.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = RecursiveTransform(kubernetes_integers))]
pub struct QueueConsumerStatus {
    /// The metadata.generation this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready, QueueReachable, ConfigValid, DeadLetterQueueHealthy, ScalingActive,
    /// ProcessingTimeWithinDeclared, HandlerHealthy, AlarmSynced, QueueManaged, FifoGroupsHealthy, ScaleOnly,
    /// ObjectiveMet
    /// (Kubernetes conditions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "conditions_schema")]
    pub conditions: Vec<Condition>,
    /// Rule results on the spec and the queue's settings, each with a recommendation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// The source queue as last read (GetQueueAttributes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<QueueStatus>,
    /// The dead-letter queue named by the source's redrive policy, its alarm and any redrive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<DeadLetterStatus>,
    /// Processing time and throughput as the worker pods report them on their /metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<ObservedStatus>,
    /// With `spec.scaling.objective`: the workers' dwell measurement against it (condition ObjectiveMet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub objective: Option<ObjectiveStatus>,
    /// Worker pods the Deployment has (its status.replicas).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Replicas the scaler decided on (0 while suspended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Label selector of the worker pods, e.g. app.kubernetes.io/instance=orders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// When the scaler last changed the Deployment's replicas (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub last_scale_time: Option<Time>,
    /// What the controller last changed on the queue (`spec.queue.manage`), from what to what.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub managed: Option<ManagedStatus>,
}

/// The controller's last change of the queue's settings (`spec.queue.manage`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagedStatus {
    /// Each attribute changed (or queue created), with the value before and after.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_changes: Vec<AttributeChange>,
    /// When they were made (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub last_change_time: Option<Time>,
}

/// One setting the controller changed.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttributeChange {
    /// The queue's URL (the source queue, or a dead-letter queue it created).
    pub queue: String,
    /// VisibilityTimeout, MaxReceiveCount, MessageRetentionPeriod, or Queue (created).
    pub attribute: String,
    /// The value before ("" for a queue that did not exist).
    #[serde(default)]
    pub from: String,
    /// The value set.
    pub to: String,
}

/// A Kubernetes timestamp (RFC 3339), with a description of its own rather than the Go type's.
fn time_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "format": "date-time",
        "nullable": true
    })
}

/// Conditions are a list map keyed by `type`, so server-side apply merges them per condition.
fn conditions_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Condition>();
    json_schema!({
        "type": "array",
        "description": "Ready, QueueReachable, ConfigValid, DeadLetterQueueHealthy, ScalingActive, ProcessingTimeWithinDeclared, HandlerHealthy, AlarmSynced, QueueManaged, FifoGroupsHealthy, ScaleOnly, ObjectiveMet (Kubernetes conditions: type, status, reason, message, lastTransitionTime). ObjectiveMet (only with spec.scaling.objective) is False (DwellAboveObjective) while more than 1 % of the messages the workers removed in their window stayed longer than dwellP99, with the observed P99 and the burn rate in the message and in status.objective; Unknown (NoMeasurement) until enough messages were measured. ScaleOnly (only with spec.scaleTargetRef) is True and lists what runs without the bundled worker and what does not; in that mode Ready and ScalingActive are False (ScaleTargetUnavailable) while the target cannot be read or scaled. FifoGroupsHealthy (FIFO queues whose workers report their groups) is False (GroupStuck) naming the groups whose head failed 3 times in a row or is older than 5 minutes. HandlerHealthy is False (DownstreamFailing) while workers report their outage breaker open, with the share in the message; while more than half do, ScalingActive is False (DownstreamFailing) and replicas are held. QueueManaged (only with spec.queue.manage on) says whether the queue's settings are what the rules ask for, what was changed, or why nothing was (ManageConflict, Suspended). Only QueueReachable, ConfigValid and the Deployment gate Ready: it is False while a new pod template rolls out (RollingOut) or the rollout is stalled (RolloutStalled, with the Deployment's message); the scaler's replica changes keep it.",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"]
    })
}

/// One rule result.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// The rule's code, e.g. VisibilityTimeoutBelowBudget (docs/rules.md).
    pub code: String,
    /// Error (blocks rollout with validation.enforce) or Warning.
    pub severity: Severity,
    /// What is wrong, with the numbers.
    pub message: String,
    /// The fix, with the numbers.
    pub recommendation: String,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema,
)]
pub enum Severity {
    Warning,
    Error,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Warning => "Warning",
            Severity::Error => "Error",
        })
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Messages available to receive (ApproximateNumberOfMessages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible: Option<i64>,
    /// Messages received and not yet deleted (ApproximateNumberOfMessagesNotVisible).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<i64>,
    /// Messages not yet receivable (ApproximateNumberOfMessagesDelayed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delayed: Option<i64>,
    /// CloudWatch ApproximateAgeOfOldestMessage (0 when SQS reports the queue empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_age_seconds: Option<i64>,
    /// The queue's VisibilityTimeout, a duration such as 30s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout: Option<Duration>,
    /// Receives before SQS moves a message to the DLQ (the redrive policy's maxReceiveCount).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_receive_count: Option<u32>,
    /// The queue's MessageRetentionPeriod, a duration such as 96h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
    /// URL of the DLQ the redrive policy names, when it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_url: Option<String>,
    /// When these numbers were read (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub sampled_at: Option<Time>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterStatus {
    /// The DLQ's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Messages in the DLQ (ApproximateNumberOfMessages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visible: Option<i64>,
    /// Age of the DLQ's oldest message in seconds (CloudWatch ApproximateAgeOfOldestMessage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_age_seconds: Option<i64>,
    /// The DLQ's MessageRetentionPeriod, a duration such as 336h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<Duration>,
    /// Name of the CloudWatch alarm the controller manages on the DLQ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm_name: Option<String>,
    /// That alarm's state: OK, ALARM or INSUFFICIENT_DATA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alarm_state: Option<String>,
    /// The last redrive asked for with the annotation sqs.consumers.dev/redrive-request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive: Option<RedriveStatus>,
    /// The last automatic redrive after recovery (`spec.deadLetter.redriveAfterRecovery`); its
    /// `request` names the HandlerHealthy transition it answered (`after-recovery:TIME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redrive_after_recovery: Option<RedriveStatus>,
    /// The DLQ's messages by `qc-poison-reason` (the top 5 of up to 100 peeked; `(none)`: moved by the
    /// redrive policy; `(other)`: the rest), read at most every 5 minutes while it holds messages. Each
    /// read adds one to the peeked messages' receive count on the DLQ; never read when the DLQ has a
    /// redrive policy of its own. `qc-operator dlq` has the full summary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_reason: Vec<ReasonCount>,
    /// When `byReason` was read (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub by_reason_sampled_at: Option<Time>,
}

/// Progress of a redrive: the DLQ's messages moved back to the source queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RedriveStatus {
    /// The annotation's value (token) this redrive answers; a different value starts another one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// MessageMoveTask (SQS moves the messages: StartMessageMoveTask) or ReceiveSendDelete (the
    /// controller moves them, where the endpoint has no move tasks or the DLQ is shared).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Messages moved back to the source so far (approximate for MessageMoveTask).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved: Option<i64>,
    /// Messages that could not be sent to the source; they stay in the DLQ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<i64>,
    /// Messages left in a shared DLQ because another source queue dead-lettered them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<i64>,
    /// This source's messages the move's selection left in the DLQ (a redrive after recovery takes
    /// only transient ones: poison, and messages it moved before, stay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_selected: Option<i64>,
    /// SQS's handle of the move task (MessageMoveTask only), to follow or cancel it with the AWS CLI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_handle: Option<String>,
    /// What happened, in words: the failure and its fix, or a request waiting for the running move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When the move started (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub started_at: Option<Time>,
    /// When it completed or failed (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub finished_at: Option<Time>,
}

/// What the controller measured on the worker pods' /metrics over a window of recent scrapes (handler
/// latency histogram deltas). Absent until two scrapes of a pod are in the window.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedStatus {
    /// P99 of the handler time per message, estimated from the histogram buckets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p99_seconds: Option<f64>,
    /// Mean handler time per message in the window (histogram sum over count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mean_seconds: Option<f64>,
    /// Messages finished per second, all pods together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages_per_second: Option<f64>,
    /// Messages finished in the window (what the P99 is estimated from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<i64>,
    /// Messages in flight on the pods at the last scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<i64>,
    /// Pods whose /metrics answered at the last scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods: Option<i32>,
    /// Ready pods whose /metrics could not be read at the last scrape: no answer within 2s, a status
    /// other than 200, an answer over 1 MiB, or no handler histogram (each is logged with its pod).
    /// Scraped once a poll interval, never retried sooner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_unreachable: Option<i32>,
    /// Of the pods that answered, those whose outage breaker was open at the last scrape (intake
    /// paused: the handler's dependency is failing; see HandlerHealthy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub breaker_open: Option<i32>,
    /// The span of the deltas, a duration such as 50s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Duration>,
    /// When the pods were last scraped (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub sampled_at: Option<Time>,
}

/// `status.objective`: the dwell objective as the workers measured it (their
/// `qc_worker_message_dwell_seconds` histogram deltas, summed over the pods, over the window).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObjectiveStatus {
    /// Observed P99 of the time from a message's send (SentTimestamp) to its leaving the queue, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dwell_p99_seconds: Option<f64>,
    /// Share of the window's messages that stayed longer than spec.scaling.objective.dwellP99 (0 to 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub over_objective: Option<f64>,
    /// The error budget's burn rate: overObjective divided by the 1 % a P99 objective allows. Above 1 the
    /// budget is spent faster than it accrues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burn_rate: Option<f64>,
    /// Messages that left the queue in the window (what the figures are estimated from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<i64>,
    /// The span of the deltas, a duration such as 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<Duration>,
    /// When the pods were last scraped (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "time_schema")]
    pub sampled_at: Option<Time>,
}

/// The API's defaults, one function per field so serde and schemars share them.
pub mod defaults {
    use super::Duration;
    pub fn scale_api_version() -> String {
        "apps/v1".to_string()
    }
    pub fn scale_kind() -> String {
        "Deployment".to_string()
    }
    pub fn recovery_healthy_for() -> Duration {
        Duration::from_secs(600)
    }
    pub fn recovery_rate() -> u32 {
        10
    }
    pub fn yes() -> bool {
        true
    }
    pub fn timeout() -> Duration {
        Duration::from_secs(30)
    }
    pub fn concurrency() -> u32 {
        10
    }
    pub fn batch_size() -> u32 {
        10
    }
    pub fn wait_time() -> Duration {
        Duration::from_secs(20)
    }
    pub fn retry_base() -> Duration {
        Duration::from_secs(5)
    }
    pub fn retry_max() -> Duration {
        Duration::from_secs(15 * 60)
    }
    pub fn breaker_failure_percent() -> u32 {
        50
    }
    pub fn breaker_window() -> u32 {
        20
    }
    pub fn batch_max_items() -> u32 {
        10
    }
    pub fn batch_max_wait() -> Duration {
        Duration::from_secs(1)
    }
    pub fn breaker_consecutive() -> u32 {
        10
    }
    pub fn breaker_probe_base() -> Duration {
        Duration::from_secs(1)
    }
    pub fn breaker_probe_max() -> Duration {
        Duration::from_secs(30)
    }
    pub fn http_port() -> u16 {
        8080
    }
    pub fn http_path() -> String {
        "/messages".to_string()
    }
    pub fn idempotency_ttl() -> Duration {
        Duration::from_secs(24 * 3600)
    }
    pub fn dynamodb_key_attribute() -> String {
        "id".to_string()
    }
    pub fn dynamodb_ttl_attribute() -> String {
        "expiresAt".to_string()
    }
    pub fn max_replicas() -> u32 {
        20
    }
    pub fn max_backlog_age() -> Duration {
        Duration::from_secs(60)
    }
    pub fn poll_interval() -> Duration {
        Duration::from_secs(15)
    }
}

/// The CRD as committed: the types' schema with each description's doc-comment line breaks joined, so
/// `kubectl explain` wraps the text itself (a blank line, a paragraph break, is kept).
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        JSONSchemaProps, JSONSchemaPropsOrArray,
    };
    use kube::CustomResourceExt;
    fn unwrap_lines(s: &mut JSONSchemaProps) {
        if let Some(d) = s.description.as_mut() {
            *d = d
                .split("\n\n")
                .map(|p| p.split('\n').map(str::trim).collect::<Vec<_>>().join(" "))
                .collect::<Vec<_>>()
                .join("\n\n");
        }
        for child in s.properties.iter_mut().flat_map(|p| p.values_mut()) {
            unwrap_lines(child);
        }
        match s.items.as_mut() {
            Some(JSONSchemaPropsOrArray::Schema(item)) => unwrap_lines(item),
            Some(JSONSchemaPropsOrArray::Schemas(items)) => items.iter_mut().for_each(unwrap_lines),
            None => {}
        }
    }
    let mut crd = QueueConsumer::crd();
    for v in &mut crd.spec.versions {
        if let Some(schema) = v
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            unwrap_lines(schema);
        }
    }
    crd
}

/// The CRD as YAML, exactly as committed under `crds/`.
pub fn crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    serde_saphyr::to_string(&crd())
}

#[cfg(test)]
mod sampling_tests {
    use super::sampling_ratio;

    #[test]
    fn sampling_percentages_become_ratios_and_anything_else_is_refused() {
        for (text, want) in [
            ("1%", 0.01),
            ("0.1%", 0.001),
            ("100%", 1.0),
            ("100.0%", 1.0),
            ("0%", 0.0),
            ("12.5%", 0.125),
        ] {
            assert_eq!(sampling_ratio(text), Ok(want), "{text}");
        }
        for text in [
            "1", "%", "101%", "1.%", ".5%", "-1%", "1e2%", "0.00001%", "1 %", "",
        ] {
            let err = sampling_ratio(text).unwrap_err();
            assert!(err.contains("from 0% to 100%"), "{text}: {err}");
        }
    }
}
