//! Spec → worker Deployment: the user's pod template plus the `qc-worker` process, rendered as values.
//! Pure: no client, no clock, no environment; `qc-operator plan` and the controller call the same function.

mod worker;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, DownwardAPIVolumeFile,
    DownwardAPIVolumeSource, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, KeyToPath,
    Lifecycle, LifecycleHandler, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec,
    Probe, ResourceRequirements, SeccompProfile, SecretKeySelector, SecurityContext, SleepAction,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;

use crate::api::{
    Duration, Handler, IdempotencyStore, QueueConsumer, QueueConsumerSpec, is_quantity,
};

pub use worker::{WorkerLaunch, region, worker_args};

/// Name of the worker container (HTTP handler layout) and of the init container's binary.
pub const WORKER_CONTAINER: &str = "qc-worker";
/// Init container that copies `qc-worker` into the shared volume (exec handler layout).
pub const INSTALL_CONTAINER: &str = "qc-worker-install";
/// emptyDir shared between the init container and the user's container (exec handler layout).
pub const WORKER_VOLUME: &str = "qc-worker-bin";
/// Where the worker binary lives in the image, and where the exec layout copies it to.
pub const WORKER_BINARY: &str = "/usr/local/bin/qc-worker";
pub const WORKER_VOLUME_MOUNT: &str = "/qc/bin";
pub const COPIED_WORKER_BINARY: &str = "/qc/bin/qc-worker";
/// `processing.maxRate`: a downward-API volume of the pod's share annotation
/// (`scaling::rate::SHARE_ANNOTATION`), mounted read-only into the worker's container; the kubelet
/// rewrites the file when the controller changes the annotation.
pub const RATE_VOLUME: &str = "qc-rate-share";
pub const RATE_MOUNT: &str = "/etc/qc/rate";
pub const RATE_SHARE_FILE: &str = "/etc/qc/rate/share";
/// `handler.schema`: the ConfigMap key, mounted read-only into the container that runs the worker.
pub const SCHEMA_VOLUME: &str = "qc-schema";
pub const SCHEMA_MOUNT: &str = "/etc/qc/schema";
pub const SCHEMA_FILE: &str = "/etc/qc/schema/schema.json";
/// The worker's /metrics, /healthz and /readyz port, unless the pod already uses it.
pub const DEFAULT_METRICS_PORT: u16 = 9090;
pub const METRICS_PORT_NAME: &str = "qc-metrics";
/// The image's non-root user (distroless `nonroot`).
pub const WORKER_UID: i64 = 65532;

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
pub const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
pub const NAME_VALUE: &str = "qc-worker";
pub const MANAGED_BY_VALUE: &str = "qc-operator";
pub const COMPONENT_VALUE: &str = "consumer";

/// Time the worker gets after its in-flight handlers' timeout to flush deletes and release unstarted
/// messages, and the time the kubelet waits after that before SIGKILL.
pub const DRAIN_MARGIN: Duration = Duration::from_secs(10);
pub const EXIT_MARGIN: Duration = Duration::from_secs(5);

/// What render needs besides the QueueConsumer: the operator's own settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RenderOptions {
    /// Image holding `/usr/local/bin/qc-worker`.
    pub worker_image: String,
    /// What `spec.worker.tracing` falls back to, field by field.
    pub tracing: TracingDefaults,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            worker_image: default_worker_image(),
            tracing: TracingDefaults::default(),
        }
    }
}

/// The operator's default tracing of workers (`qc-operator run --worker-tracing`, chart values
/// `tracing.*`): off, no endpoint, 1 %.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracingDefaults {
    pub enabled: bool,
    pub endpoint: Option<String>,
    /// A percentage as `spec.worker.tracing.sampling` takes it.
    pub sampling: String,
}

impl Default for TracingDefaults {
    fn default() -> Self {
        TracingDefaults {
            enabled: false,
            endpoint: None,
            sampling: "1%".into(),
        }
    }
}

/// The image of this release (`queue-consumer-operator:<crate version>`).
pub fn default_worker_image() -> String {
    format!("queue-consumer-operator:{}", env!("CARGO_PKG_VERSION"))
}

/// Why a QueueConsumer cannot be rendered; each message names the field and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("metadata.name is missing: give the QueueConsumer a name")]
    MissingName,
    #[error(
        "spec.handler must set exactly one of http or exec (or, for a consumer you already run, set spec.scaleTargetRef instead of handler and template: scale-only mode)"
    )]
    NoHandler,
    /// Scale-only mode mixed with the bundled worker's fields (`QueueConsumerSpec::mode_conflict`).
    #[error("{0}")]
    ModeConflict(String),
    #[error(
        "spec.template.spec.containers is empty: add the container that {needs} (the worker is added by the controller)"
    )]
    NoUserContainer { needs: &'static str },
    #[error(
        "spec.template.spec.{field}[{index}].name {name:?} is reserved for the worker: rename that container"
    )]
    ReservedContainerName {
        field: &'static str,
        index: usize,
        name: String,
    },
    #[error(
        "spec.template.spec.volumes[{index}].name {name:?} is reserved for the worker: rename that volume"
    )]
    ReservedVolumeName { index: usize, name: &'static str },
    #[error(
        "spec.template.spec.{field}[{index}].volumeMounts[{mount}] mounts {WORKER_VOLUME:?}, the worker binary's volume: only the worker may mount it; remove that mount"
    )]
    WorkerVolumeMounted {
        field: &'static str,
        index: usize,
        mount: usize,
    },
    #[error(
        "spec.template.spec.{field}[{index}].ports[{port}].name {METRICS_PORT_NAME:?} is reserved for the worker's metrics port: rename that port"
    )]
    ReservedPortName {
        field: &'static str,
        index: usize,
        port: usize,
    },
    #[error(
        "spec.worker.resources.{field} {value:?} is not a Kubernetes quantity: write e.g. 50m or 0.5 (cpu), 128Mi (memory)"
    )]
    InvalidQuantity { field: String, value: String },
    #[error(
        "spec.worker.tracing turns tracing on but no endpoint is set: set spec.worker.tracing.endpoint to the collector's OTLP/HTTP URL (e.g. http://otel-collector.observability:4318), or ask the operator's admin for the chart value tracing.otlp.endpoint"
    )]
    TracingWithoutEndpoint,
    #[error("spec.worker.tracing.{field}: {reason}")]
    InvalidTracing { field: &'static str, reason: String },
}

impl RenderError {
    /// CamelCase reason for the ConfigValid condition.
    pub fn reason(&self) -> &'static str {
        match self {
            RenderError::MissingName => "MissingName",
            RenderError::NoHandler => "NoHandler",
            RenderError::ModeConflict(_) => "ModeConflict",
            RenderError::NoUserContainer { .. } => "NoHandlerContainer",
            RenderError::ReservedContainerName { .. }
            | RenderError::ReservedVolumeName { .. }
            | RenderError::ReservedPortName { .. }
            | RenderError::WorkerVolumeMounted { .. } => "ReservedName",
            RenderError::InvalidQuantity { .. } => "InvalidResources",
            RenderError::TracingWithoutEndpoint | RenderError::InvalidTracing { .. } => {
                "InvalidTracing"
            }
        }
    }
}

/// Labels on the Deployment and its pods. `app.kubernetes.io/part-of` is left to the user: it names the
/// larger application, which only they know.
pub fn labels(name: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(name);
    l.insert(LABEL_MANAGED_BY.into(), MANAGED_BY_VALUE.into());
    l.insert(LABEL_COMPONENT.into(), COMPONENT_VALUE.into());
    l
}

/// The Deployment's selector: stable for the life of the QueueConsumer (selectors are immutable).
pub fn selector_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_INSTANCE.to_string(), name.to_string()),
        (LABEL_NAME.to_string(), NAME_VALUE.to_string()),
    ])
}

/// The selector as a label-selector string (for `status.selector`).
pub fn selector_string(name: &str) -> String {
    selector_labels(name)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// How long the worker may take to drain on SIGTERM: the longest handler run, a long poll that may
/// still return messages to release, and the drain margin.
pub fn shutdown_timeout(spec: &QueueConsumerSpec) -> Duration {
    spec.processing
        .timeout
        .saturating_add(spec.processing.wait_time)
        .saturating_add(DRAIN_MARGIN)
}

/// The pod's grace period: the worker's own deadline comes first, so it exits by itself.
pub fn termination_grace_seconds(spec: &QueueConsumerSpec) -> i64 {
    let secs = shutdown_timeout(spec)
        .saturating_add(EXIT_MARGIN)
        .as_secs_ceil();
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// The owner reference that ties the Deployment to its QueueConsumer; None before the object exists
/// in a cluster (no uid), e.g. in `qc-operator plan`. It blocks the owner's deletion, as the built-in
/// controllers' references do (Deployment → ReplicaSet → Pod): a foreground deletion of the QueueConsumer
/// (`kubectl delete --cascade=foreground`, Argo CD's default) then ends only once its Deployment, and so
/// its draining pods, are gone, and tools that wait for a deletion wait for the workers too. Setting it
/// needs `update` on `queueconsumers/finalizers` where OwnerReferencesPermissionEnforcement runs, which
/// the chart grants (docs/security.md); a background deletion is unchanged.
pub fn owner_reference(qc: &QueueConsumer) -> Option<OwnerReference> {
    qc.controller_owner_ref(&()).map(|o| OwnerReference {
        block_owner_deletion: Some(true),
        ..o
    })
}

/// The worker Deployment for `qc`. Replicas are left unset: the scaler owns them.
pub fn deployment(qc: &QueueConsumer, opts: &RenderOptions) -> Result<Deployment, RenderError> {
    let name = qc.metadata.name.clone().ok_or(RenderError::MissingName)?;
    let spec = &qc.spec;
    let role = crate::aws::identity::of_consumer(qc);
    let namespace = qc
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let handler = spec.handler.one().ok_or(RenderError::NoHandler)?;
    let mut template = spec.template.clone();
    let mut pod = template.spec.take().unwrap_or_default();
    check_reserved_names(&pod)?;
    if pod.containers.is_empty() {
        return Err(RenderError::NoUserContainer {
            needs: match handler {
                Handler::Http(_) => "serves the http handler",
                Handler::Exec(_) => "holds the exec handler's command",
            },
        });
    }
    let metrics_port = pick_metrics_port(&pod, &handler);
    let exec = matches!(handler, Handler::Exec(_));
    let mut env = worker_env(spec);
    env.extend(tracing_env(spec, &namespace, &name, &opts.tracing)?);
    let resources = worker_resources(spec)?;

    match handler {
        Handler::Http(http) => {
            let launch = WorkerLaunch::Http {
                url: format!("http://127.0.0.1:{}{}", http.port, http.path),
            };
            let mut worker = Container {
                name: WORKER_CONTAINER.into(),
                image: Some(opts.worker_image.clone()),
                command: Some(vec![WORKER_BINARY.into()]),
                args: Some(worker_args(
                    spec,
                    &namespace,
                    role.as_ref(),
                    metrics_port,
                    &launch,
                )),
                env: Some(env),
                resources: Some(resources),
                security_context: Some(restricted_security_context()),
                ..Container::default()
            };
            add_health(&mut worker, metrics_port);
            // The kubelet signals every container at once; the handler must outlive the worker's
            // drain or in-flight messages fail and are redelivered.
            let hold =
                Duration::from_secs(u64::try_from(termination_grace_seconds(spec)).unwrap_or(0))
                    .saturating_sub(EXIT_MARGIN);
            for c in &mut pod.containers {
                hold_until_drained(c, hold);
            }
            pod.containers.push(worker);
        }
        Handler::Exec(exec) => {
            let launch = WorkerLaunch::Exec {
                command: exec.command.clone(),
            };
            let install = Container {
                name: INSTALL_CONTAINER.into(),
                image: Some(opts.worker_image.clone()),
                command: Some(vec![
                    WORKER_BINARY.into(),
                    "--copy-self-to".into(),
                    COPIED_WORKER_BINARY.into(),
                ]),
                volume_mounts: Some(vec![worker_mount(false)]),
                resources: Some(resources),
                security_context: Some(restricted_security_context()),
                ..Container::default()
            };
            pod.init_containers.get_or_insert_default().push(install);
            pod.volumes.get_or_insert_default().push(Volume {
                name: WORKER_VOLUME.into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
            // The first container is the handler's; others are the user's sidecars, left alone.
            let pod_context = pod.security_context.clone().unwrap_or_default();
            let c = &mut pod.containers[0];
            restrict_unset(c, &pod_context);
            c.command = Some(vec![COPIED_WORKER_BINARY.into()]);
            c.args = Some(worker_args(
                spec,
                &namespace,
                role.as_ref(),
                metrics_port,
                &launch,
            ));
            merge_env(c.env.get_or_insert_default(), env);
            // Read-only: a handler compromised through a message cannot replace the worker that
            // runs it (only the install step writes the volume).
            c.volume_mounts
                .get_or_insert_default()
                .push(worker_mount(true));
            add_health(c, metrics_port);
        }
    }

    if qc.spec.processing.max_rate.is_some() {
        add_rate_share(&mut pod, exec);
    }
    if let Some(schema) = &qc.spec.handler.schema {
        add_schema(&mut pod, exec, &schema.config_map_key_ref);
    }

    // qc-worker never calls the Kubernetes API, so the pods get no API token unless the user's template
    // asks for one. IRSA and EKS Pod Identity project tokens of their own and are unaffected.
    pod.automount_service_account_token.get_or_insert(false);

    let grace = termination_grace_seconds(spec);
    pod.termination_grace_period_seconds = Some(
        pod.termination_grace_period_seconds
            .map_or(grace, |user| user.max(grace)),
    );

    let mut pod_meta = template.metadata.take().unwrap_or_default();
    pod_meta
        .labels
        .get_or_insert_default()
        .extend(labels(&name));
    // Names and namespaces of pod templates are ignored by the API server; dropping them keeps the
    // applied object free of fields the server would discard.
    pod_meta.name = None;
    pod_meta.namespace = None;

    Ok(Deployment {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: qc.metadata.namespace.clone(),
            labels: Some(labels(&name)),
            owner_references: owner_reference(qc).map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        spec: DeploymentSpec {
            selector: LabelSelector {
                match_labels: Some(selector_labels(&name)),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(pod_meta),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    })
}

fn check_reserved_names(pod: &PodSpec) -> Result<(), RenderError> {
    let reserved = [WORKER_CONTAINER, INSTALL_CONTAINER];
    let lists: [(&'static str, &[Container]); 2] = [
        ("containers", &pod.containers),
        (
            "initContainers",
            pod.init_containers.as_deref().unwrap_or(&[]),
        ),
    ];
    for (field, list) in lists {
        if let Some((index, c)) = list
            .iter()
            .enumerate()
            .find(|(_, c)| reserved.contains(&c.name.as_str()))
        {
            return Err(RenderError::ReservedContainerName {
                field,
                index,
                name: c.name.clone(),
            });
        }
        // The controller scrapes the port of this name: a user's port of the name would be taken
        // for the worker's (or clash with it, as port names are unique in a pod). The worker's
        // volume is mounted by the worker's containers alone: another container could replace
        // the binary the worker runs from.
        for (index, c) in list.iter().enumerate() {
            if let Some(mount) = c
                .volume_mounts
                .iter()
                .flatten()
                .position(|m| m.name == WORKER_VOLUME)
            {
                return Err(RenderError::WorkerVolumeMounted {
                    field,
                    index,
                    mount,
                });
            }
            if let Some(port) = c
                .ports
                .iter()
                .flatten()
                .position(|p| p.name.as_deref() == Some(METRICS_PORT_NAME))
            {
                return Err(RenderError::ReservedPortName { field, index, port });
            }
        }
    }
    for name in [WORKER_VOLUME, RATE_VOLUME, SCHEMA_VOLUME] {
        if let Some(index) = pod.volumes.iter().flatten().position(|v| v.name == name) {
            return Err(RenderError::ReservedVolumeName { index, name });
        }
    }
    Ok(())
}

/// 9090 unless the handler or a user container already listens there: all containers share the pod's
/// network namespace, so the worker takes the next free port.
fn pick_metrics_port(pod: &PodSpec, handler: &Handler<'_>) -> u16 {
    let mut taken: Vec<i32> = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten())
        .map(|p| p.container_port)
        .collect();
    if let Handler::Http(h) = handler {
        taken.push(i32::from(h.port));
    }
    (DEFAULT_METRICS_PORT..=u16::MAX)
        .find(|p| !taken.contains(&i32::from(*p)))
        .unwrap_or(DEFAULT_METRICS_PORT)
}

/// The worker's OTLP settings (`telemetry::otlp` reads them) when `spec.worker.tracing`, or the
/// operator's default, turns tracing on; none otherwise. The sampler follows a producer's decision
/// (`parentbased_traceidratio`).
pub fn tracing_env(
    spec: &QueueConsumerSpec,
    namespace: &str,
    name: &str,
    defaults: &TracingDefaults,
) -> Result<Vec<EnvVar>, RenderError> {
    let t = spec.worker.tracing.clone().unwrap_or_default();
    if !t.enabled.unwrap_or(defaults.enabled) {
        return Ok(Vec::new());
    }
    let endpoint = t
        .endpoint
        .or_else(|| defaults.endpoint.clone())
        .filter(|e| !e.trim().is_empty())
        .ok_or(RenderError::TracingWithoutEndpoint)?;
    if !endpoint.starts_with("http://")
        || endpoint.len() <= "http://".len()
        || !endpoint.bytes().all(|b| (b'!'..=b'~').contains(&b))
    {
        return Err(RenderError::InvalidTracing {
            field: "endpoint",
            reason: format!(
                "{endpoint:?} is not an http:// URL: give the collector's OTLP/HTTP base URL, e.g. http://otel-collector.observability:4318"
            ),
        });
    }
    let (sampling, field) = match &t.sampling {
        Some(s) => (s.as_str(), "sampling"),
        None => (
            defaults.sampling.as_str(),
            "sampling (the operator's default, chart value tracing.sampling)",
        ),
    };
    let ratio = crate::api::sampling_ratio(sampling)
        .map_err(|reason| RenderError::InvalidTracing { field, reason })?;
    Ok(vec![
        plain_env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        plain_env("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
        plain_env("OTEL_TRACES_SAMPLER_ARG", &ratio.to_string()),
        plain_env("OTEL_SERVICE_NAME", NAME_VALUE),
        plain_env(
            "OTEL_RESOURCE_ATTRIBUTES",
            &format!("k8s.namespace.name={namespace},k8s.deployment.name={name}"),
        ),
    ])
}

/// Region and endpoint for the SDK, the pod's identity for the worker, and the redis URL from its
/// Secret (never on the command line, where `ps` and the pod spec would show it).
fn worker_env(spec: &QueueConsumerSpec) -> Vec<EnvVar> {
    let mut env = Vec::new();
    if let Some(region) = worker::region(spec) {
        env.push(plain_env("AWS_REGION", &region));
    }
    if let Some(endpoint) = &spec.queue.endpoint {
        env.push(plain_env("AWS_ENDPOINT_URL_SQS", endpoint));
    }
    for (name, path) in [
        ("POD_NAME", "metadata.name"),
        ("POD_NAMESPACE", "metadata.namespace"),
    ] {
        env.push(EnvVar {
            name: name.into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: path.into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    if spec.idempotency.store == IdempotencyStore::Redis
        && let Some(redis) = &spec.idempotency.redis
    {
        env.push(EnvVar {
            name: "QC_REDIS_URL".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: redis.url_secret_ref.name.clone(),
                    key: redis.url_secret_ref.key.clone(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        });
    }
    env
}

fn plain_env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// The worker's variables replace same-named ones of the user: they describe the queue of the spec.
fn merge_env(env: &mut Vec<EnvVar>, ours: Vec<EnvVar>) {
    env.retain(|e| !ours.iter().any(|o| o.name == e.name));
    env.extend(ours);
}

/// The share file of `processing.maxRate`: the pod's annotation through a downward-API volume, in the
/// container that runs the worker (the worker's own, or the exec handler's first container).
fn add_rate_share(pod: &mut PodSpec, exec: bool) {
    pod.volumes.get_or_insert_default().push(Volume {
        name: RATE_VOLUME.into(),
        downward_api: Some(DownwardAPIVolumeSource {
            items: Some(vec![DownwardAPIVolumeFile {
                path: "share".into(),
                field_ref: Some(ObjectFieldSelector {
                    field_path: format!(
                        "metadata.annotations['{}']",
                        crate::scaling::rate::SHARE_ANNOTATION
                    ),
                    ..ObjectFieldSelector::default()
                }),
                ..DownwardAPIVolumeFile::default()
            }]),
            ..DownwardAPIVolumeSource::default()
        }),
        ..Volume::default()
    });
    let container = if exec {
        pod.containers.first_mut()
    } else {
        pod.containers
            .iter_mut()
            .find(|c| c.name == WORKER_CONTAINER)
    };
    if let Some(c) = container {
        c.volume_mounts.get_or_insert_default().push(VolumeMount {
            name: RATE_VOLUME.into(),
            mount_path: RATE_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
}

/// `handler.schema`: the ConfigMap key as `SCHEMA_FILE`, in the container that runs the worker. Not
/// optional: a missing ConfigMap or key keeps the pod from starting (a visible error) rather than
/// running a worker that checks nothing.
fn add_schema(pod: &mut PodSpec, exec: bool, r: &crate::api::ConfigMapKeyRef) {
    pod.volumes.get_or_insert_default().push(Volume {
        name: SCHEMA_VOLUME.into(),
        config_map: Some(ConfigMapVolumeSource {
            name: r.name.clone(),
            items: Some(vec![KeyToPath {
                key: r.key.clone(),
                path: "schema.json".into(),
                ..KeyToPath::default()
            }]),
            optional: Some(false),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
    let container = if exec {
        pod.containers.first_mut()
    } else {
        pod.containers
            .iter_mut()
            .find(|c| c.name == WORKER_CONTAINER)
    };
    if let Some(c) = container {
        c.volume_mounts.get_or_insert_default().push(VolumeMount {
            name: SCHEMA_VOLUME.into(),
            mount_path: SCHEMA_MOUNT.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
    }
}

fn worker_mount(read_only: bool) -> VolumeMount {
    VolumeMount {
        name: WORKER_VOLUME.into(),
        mount_path: WORKER_VOLUME_MOUNT.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// Liveness and readiness on the worker's health port; a user's own probes are kept.
fn add_health(c: &mut Container, port: u16) {
    let ports = c.ports.get_or_insert_default();
    if !ports.iter().any(|p| p.container_port == i32::from(port)) {
        ports.push(ContainerPort {
            name: Some(METRICS_PORT_NAME.into()),
            container_port: i32::from(port),
            protocol: Some("TCP".into()),
            ..ContainerPort::default()
        });
    }
    let probe = |path: &str, period: i32, failures: i32| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    };
    if c.liveness_probe.is_none() {
        c.liveness_probe = Some(probe("/healthz", 10, 3));
    }
    if c.readiness_probe.is_none() {
        c.readiness_probe = Some(probe("/readyz", 5, 2));
    }
}

/// A preStop sleep keeps the handler serving while the worker drains; a user's own preStop is kept.
fn hold_until_drained(c: &mut Container, hold: Duration) {
    let lifecycle = c.lifecycle.get_or_insert_default();
    if lifecycle.pre_stop.is_none() {
        lifecycle.pre_stop = Some(LifecycleHandler {
            sleep: Some(SleepAction {
                seconds: i64::try_from(hold.as_secs_ceil()).unwrap_or(i64::MAX),
            }),
            ..LifecycleHandler::default()
        });
    }
    if *lifecycle == Lifecycle::default() {
        c.lifecycle = None;
    }
}

/// `spec.worker.resources` as the container's requirements; every amount must be a quantity.
fn worker_resources(spec: &QueueConsumerSpec) -> Result<ResourceRequirements, RenderError> {
    let r = &spec.worker.resources;
    let list = |which: &str, amounts: &crate::api::ResourceAmounts| {
        let mut out = BTreeMap::new();
        for (name, q) in amounts.entries() {
            if !is_quantity(&q.0) {
                return Err(RenderError::InvalidQuantity {
                    field: format!("{which}.{name}"),
                    value: q.0.clone(),
                });
            }
            out.insert(name.to_string(), q.clone());
        }
        Ok((!out.is_empty()).then_some(out))
    };
    Ok(ResourceRequirements {
        requests: list("requests", &r.requests)?,
        limits: list("limits", &r.limits)?,
        ..ResourceRequirements::default()
    })
}

/// The exec layout runs the worker inside the user's container: it gets the `restricted` Pod Security
/// Standard's fields that neither it nor the pod sets. A field the user set, at either level, wins.
/// `readOnlyRootFilesystem` and `runAsUser` are left alone: the standard does not ask for them, and
/// only the user knows whether their handler writes to its filesystem or which user its image has.
fn restrict_unset(c: &mut Container, pod: &PodSecurityContext) {
    let sc = c.security_context.get_or_insert_default();
    let privileged = sc.privileged == Some(true)
        || sc
            .capabilities
            .as_ref()
            .and_then(|caps| caps.add.as_ref())
            .is_some_and(|add| add.iter().any(|a| a == "SYS_ADMIN" || a == "CAP_SYS_ADMIN"));
    // The API server rejects allowPrivilegeEscalation=false next to privileged or CAP_SYS_ADMIN.
    if sc.allow_privilege_escalation.is_none() && !privileged {
        sc.allow_privilege_escalation = Some(false);
    }
    let caps = sc.capabilities.get_or_insert_default();
    if caps.drop.is_none() {
        caps.drop = Some(vec!["ALL".into()]);
    }
    let root_chosen = sc.run_as_user == Some(0) || pod.run_as_user == Some(0);
    if sc.run_as_non_root.is_none() && pod.run_as_non_root.is_none() && !root_chosen {
        sc.run_as_non_root = Some(true);
    }
    if sc.seccomp_profile.is_none() && pod.seccomp_profile.is_none() {
        sc.seccomp_profile = Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        });
    }
}

/// What the `restricted` Pod Security Standard asks of a container.
fn restricted_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(WORKER_UID),
        run_as_group: Some(WORKER_UID),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        ..SecurityContext::default()
    }
}

#[cfg(test)]
mod tests;
