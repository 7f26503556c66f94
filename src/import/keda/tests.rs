use super::*;
use crate::api::{Mode, Stabilization};

fn run(text: &str, opts: Options) -> Result<Report, Vec<ImportError>> {
    let r = import(
        &[Input {
            file: "so.yaml".into(),
            text: text.into(),
        }],
        &opts,
    );
    if r.errors.is_empty() {
        Ok(r)
    } else {
        assert!(r.consumers.is_empty(), "no consumer beside errors");
        Err(r.errors)
    }
}

fn ok(text: &str, opts: Options) -> Report {
    match run(text, opts) {
        Ok(r) => r,
        Err(e) => panic!("import failed: {e:#?}"),
    }
}

fn errors(text: &str, opts: Options) -> Vec<String> {
    match run(text, opts) {
        Ok(r) => panic!("import succeeded: {:#?}", r.consumers),
        Err(e) => e.iter().map(ToString::to_string).collect(),
    }
}

/// The notes as `field: message`.
fn notes(r: &Report) -> Vec<String> {
    r.notes
        .iter()
        .map(|n| format!("{}: {}", n.field, n.message))
        .collect()
}

fn has_note(r: &Report, field: &str, part: &str) -> bool {
    r.notes
        .iter()
        .any(|n| n.field == field && n.message.contains(part))
}

const SO: &str = "
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: orders, namespace: shop}
spec:
  scaleTargetRef: {name: orders-consumer}
  triggers:
  - type: aws-sqs-queue
    metadata:
      queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders
      awsRegion: eu-west-1
";

fn with(extra_spec: &str, extra_meta: &str) -> String {
    format!(
        "apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata:
  name: orders
  namespace: shop
{extra_meta}
spec:
  scaleTargetRef: {{name: orders-consumer}}
{extra_spec}
  triggers:
  - type: aws-sqs-queue
    metadata:
      queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders
"
    )
}

#[test]
fn a_bare_scaled_object_becomes_a_scale_only_consumer_with_kedas_defaults_and_a_placeholder_p99() {
    let r = ok(SO, Options::default());
    let [qc] = r.consumers.as_slice() else {
        panic!("one consumer: {:#?}", r.consumers)
    };
    let spec = &qc.consumer.spec;
    assert_eq!(qc.name(), "shop/orders");
    assert_eq!(
        spec.mode(),
        Mode::ScaleOnly(&api::ScaleTargetRef {
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            name: "orders-consumer".into(),
        })
    );
    assert_eq!(
        spec.queue.url,
        "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
    );
    assert_eq!(spec.queue.region.as_deref(), Some("eu-west-1"));
    assert!(spec.aws.is_empty());
    assert_eq!(spec.processing.p99, PLACEHOLDER_P99);
    assert_eq!(spec.processing.concurrency, KEDA_DEFAULT_QUEUE_LENGTH);
    assert_eq!(spec.scaling.max_replicas, KEDA_DEFAULT_MAX_REPLICAS);
    assert_eq!(spec.scaling.max_backlog_age, PLACEHOLDER_P99);
    assert_eq!(spec.scaling.min_replicas, 0);
    assert!(!spec.suspend);
    assert_eq!(qc.todos, ["spec.processing.p99"]);
    assert!(
        qc.yaml.contains("# TODO(import): p99 is a placeholder"),
        "{}",
        qc.yaml
    );
    assert!(qc.yaml.contains("NOT READY TO APPLY"), "{}", qc.yaml);
    assert!(
        has_note(
            &r,
            "spec.triggers[0].metadata.queueLength",
            "5 (KEDA's default): does not map 1:1"
        ),
        "{:#?}",
        notes(&r)
    );
    assert!(
        r.notes
            .iter()
            .any(|n| n.todo && n.field == "QueueConsumer orders: spec.processing.p99")
    );
}

#[test]
fn a_declared_p99_and_concurrency_leave_nothing_to_fill_in() {
    let opts = Options {
        p99: Some(Duration::from_secs(2)),
        concurrency: Some(8),
        ..Options::default()
    };
    let r = ok(SO, opts);
    let qc = &r.consumers[0];
    assert_eq!(qc.consumer.spec.processing.p99, Duration::from_secs(2));
    assert_eq!(qc.consumer.spec.processing.concurrency, 8);
    // maxBacklogAge back to the API's default: it was only there to match the placeholder
    assert_eq!(
        qc.consumer.spec.scaling.max_backlog_age,
        api::defaults::max_backlog_age()
    );
    assert!(qc.todos.is_empty());
    assert!(!qc.yaml.contains("TODO"), "{}", qc.yaml);
    assert!(r.notes.iter().all(|n| !n.todo), "{:#?}", notes(&r));
    assert!(has_note(
        &r,
        "spec.triggers[0].metadata.queueLength",
        "concurrency 8 (from --concurrency), p99 2s (from --p99)"
    ));
}

#[test]
fn a_p99_beyond_the_default_timeout_raises_the_timeout_with_it() {
    let opts = Options {
        p99: Some(Duration::from_secs(45)),
        ..Options::default()
    };
    let qc = &ok(SO, opts).consumers[0];
    assert_eq!(qc.consumer.spec.processing.p99, Duration::from_secs(45));
    assert_eq!(qc.consumer.spec.processing.timeout, Duration::from_secs(45));
}

#[test]
fn scaled_object_fields_map_to_scaling() {
    let text = with(
        "  minReplicaCount: 1
  maxReplicaCount: 12
  pollingInterval: 10
  advanced:
    horizontalPodAutoscalerConfig:
      behavior:
        scaleDown:
          stabilizationWindowSeconds: 120
          policies: [{type: Percent, value: 50, periodSeconds: 15}]
        scaleUp: {stabilizationWindowSeconds: 0}",
        "",
    );
    let r = ok(&text, Options::default());
    let s = &r.consumers[0].consumer.spec.scaling;
    assert_eq!(s.min_replicas, 1);
    assert_eq!(s.max_replicas, 12);
    assert_eq!(s.poll_interval, Duration::from_secs(10));
    assert_eq!(
        s.scale_down_stabilization,
        Stabilization::Fixed(Duration::from_secs(120))
    );
    let prefix = "spec.advanced.horizontalPodAutoscalerConfig.behavior";
    assert!(has_note(
        &r,
        &format!("{prefix}.scaleDown.policies"),
        "not mapped"
    ));
    assert!(has_note(
        &r,
        &format!("{prefix}.scaleUp"),
        "no scale-up policies"
    ));
}

#[test]
fn trigger_metadata_maps_to_queue_and_scaling() {
    let text = "
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: orders}
spec:
  scaleTargetRef: {apiVersion: argoproj.io/v1alpha1, kind: Rollout, name: orders}
  triggers:
  - type: aws-sqs-queue
    metadata:
      queueURL: http://localstack:4566/000000000000/orders
      awsEndpoint: http://localstack:4566
      queueLength: \"20\"
      activationQueueLength: 3
      scaleOnInFlight: \"false\"
      scaleOnDelayed: \"true\"
      identityOwner: operator
      extra: x
";
    let r = ok(text, Options::default());
    let qc = &r.consumers[0].consumer;
    assert_eq!(qc.metadata.namespace, None);
    assert_eq!(
        qc.spec.queue.endpoint.as_deref(),
        Some("http://localstack:4566")
    );
    assert_eq!(qc.spec.queue.region, None);
    assert_eq!(qc.spec.processing.concurrency, 20);
    assert_eq!(qc.spec.scaling.activation_backlog, 3);
    assert!(!qc.spec.scaling.scale_on_in_flight);
    assert_eq!(
        qc.spec
            .scale_target_ref
            .as_ref()
            .map(api::ScaleTargetRef::describe),
        Some("Rollout/orders".to_string())
    );
    assert!(has_note(
        &r,
        "spec.triggers[0].metadata.scaleOnDelayed",
        "not mapped"
    ));
    assert!(has_note(
        &r,
        "spec.triggers[0].metadata.extra",
        "not a parameter"
    ));
}

#[test]
fn idle_replica_count_becomes_the_floor_and_says_what_is_lost() {
    let r = ok(
        &with("  minReplicaCount: 2\n  idleReplicaCount: 0", ""),
        Options::default(),
    );
    assert_eq!(r.consumers[0].consumer.spec.scaling.min_replicas, 0);
    assert!(has_note(
        &r,
        "spec.idleReplicaCount",
        "set scaling.minReplicas: 2 instead"
    ));
}

#[test]
fn pause_annotations_suspend_only_when_kedas_pause_stops_at_zero_or_where_it_is() {
    let suspend = |annotations: &str| {
        let r = ok(
            &with("", &format!("  annotations: {{{annotations}}}")),
            Options::default(),
        );
        (r.consumers[0].consumer.spec.suspend, notes(&r))
    };
    let (s, n) = suspend("autoscaling.keda.sh/paused: \"true\"");
    assert!(s);
    assert!(
        n.iter()
            .any(|n| n.contains("KEDA's pause kept the replicas")),
        "{n:#?}"
    );
    // KEDA reads a value that is no boolean as true
    assert!(suspend("autoscaling.keda.sh/paused: \"yes\"").0);
    assert!(!suspend("autoscaling.keda.sh/paused: \"false\"").0);
    assert!(suspend("autoscaling.keda.sh/paused-replicas: \"0\"").0);
    let (s, n) =
        suspend("autoscaling.keda.sh/paused-replicas: \"3\", autoscaling.keda.sh/paused: \"true\"");
    assert!(!s, "KEDA held 3 replicas: suspend would stop them");
    assert!(
        n.iter()
            .any(|n| n.contains("set scaling.minReplicas and scaling.maxReplicas to 3")),
        "{n:#?}"
    );
    let (s, n) = suspend("scaledobject.keda.sh/transfer-hpa-ownership: \"true\", team: shop");
    assert!(!s);
    assert_eq!(
        n.iter()
            .filter(|n| n.starts_with("metadata.annotations"))
            .count(),
        1,
        "{n:#?}"
    );
}

#[test]
fn not_mapped_fields_get_one_note_each() {
    let r = ok(
        &with(
            "  cooldownPeriod: 300
  initialCooldownPeriod: 60
  fallback: {failureThreshold: 3, replicas: 6}
  advanced:
    restoreToOriginalReplicaCount: true
    horizontalPodAutoscalerConfig: {name: my-hpa}
    scalingModifiers: {formula: x, target: \"2\"}
  somethingNew: 1",
            "",
        ),
        Options::default(),
    );
    for (field, part) in [
        (
            "spec.cooldownPeriod",
            "set scaling.scaleDownStabilization: 5m",
        ),
        ("spec.initialCooldownPeriod", "not mapped"),
        ("spec.fallback", "KEDA moved to 6 replicas"),
        ("spec.advanced.restoreToOriginalReplicaCount", "not mapped"),
        (
            "spec.advanced.horizontalPodAutoscalerConfig.name",
            "not needed",
        ),
        ("spec.advanced.scalingModifiers", "not mapped"),
        ("spec.somethingNew", "not a ScaledObject field"),
    ] {
        assert!(has_note(&r, field, part), "{field}: {:#?}", notes(&r));
    }
}

const AUTH_AWS: &str = "
apiVersion: keda.sh/v1alpha1
kind: TriggerAuthentication
metadata: {name: sqs-auth, namespace: shop}
spec:
  podIdentity: {provider: aws, roleArn: \"arn:aws:iam::123456789012:role/orders-scaler\", externalID: abc}
";

fn with_auth(auth: &str, kind: &str) -> String {
    format!(
        "{auth}---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: orders, namespace: shop}}
spec:
  scaleTargetRef: {{name: orders-consumer}}
  triggers:
  - type: aws-sqs-queue
    authenticationRef: {{name: sqs-auth, kind: {kind}}}
    metadata:
      queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders
"
    )
}

#[test]
fn pod_identity_aws_with_a_role_becomes_the_role_arn() {
    let r = ok(
        &with_auth(AUTH_AWS, "TriggerAuthentication"),
        Options::default(),
    );
    let qc = &r.consumers[0];
    assert_eq!(
        qc.consumer.spec.aws.role_arn.as_deref(),
        Some("arn:aws:iam::123456789012:role/orders-scaler")
    );
    assert!(qc.yaml.contains("ExternalId qc:shop"), "{}", qc.yaml);
    assert!(has_note(
        &r,
        "TriggerAuthentication shop/sqs-auth spec.podIdentity.externalID",
        "qc:shop"
    ));
}

#[test]
fn a_cluster_trigger_authentication_is_found_in_any_namespace() {
    let auth = AUTH_AWS
        .replace(
            "kind: TriggerAuthentication",
            "kind: ClusterTriggerAuthentication",
        )
        .replace(", namespace: shop", "");
    let r = ok(
        &with_auth(&auth, "ClusterTriggerAuthentication"),
        Options::default(),
    );
    assert!(r.consumers[0].consumer.spec.aws.role_arn.is_some());
    // a TriggerAuthentication of that name is not a ClusterTriggerAuthentication
    let e = errors(
        &with_auth(AUTH_AWS, "ClusterTriggerAuthentication"),
        Options::default(),
    );
    assert!(
        e[0].contains("ClusterTriggerAuthentication \"sqs-auth\" is not in the files given"),
        "{e:#?}"
    );
}

#[test]
fn a_trigger_authentication_of_another_namespace_is_not_used() {
    let e = errors(
        &with_auth(
            &AUTH_AWS.replace("namespace: shop", "namespace: billing"),
            "TriggerAuthentication",
        ),
        Options::default(),
    );
    assert_eq!(
        e,
        [
            "so.yaml, document 2: ScaledObject shop/orders: spec.triggers[0].authenticationRef.name: TriggerAuthentication \"sqs-auth\" is not in the files given: add the file that holds it (`kubectl get triggerauthentication sqs-auth -n shop -o yaml > sqs-auth.yaml`) and import again"
        ]
    );
}

#[test]
fn a_role_kept_in_a_secret_is_a_todo_with_where_to_find_it() {
    let auth = "
apiVersion: keda.sh/v1alpha1
kind: TriggerAuthentication
metadata: {name: sqs-auth, namespace: shop}
spec:
  secretTargetRef:
  - {parameter: awsRoleArn, name: aws-secrets, key: AWS_ROLE_ARN}
  - {parameter: awsAccessKeyID, name: aws-secrets, key: AWS_ACCESS_KEY_ID}
";
    let r = ok(
        &with_auth(auth, "TriggerAuthentication"),
        Options::default(),
    );
    let qc = &r.consumers[0];
    assert!(qc.consumer.spec.aws.role_arn.is_none());
    assert_eq!(qc.todos, ["spec.aws.roleArn", "spec.processing.p99"]);
    assert!(
        qc.yaml
            .contains("# TODO(import): aws.roleArn: KEDA used the role ARN in Secret aws-secrets, key AWS_ROLE_ARN"),
        "{}",
        qc.yaml
    );
    assert!(r.notes.iter().any(|n| n.todo
        && n.field == "TriggerAuthentication shop/sqs-auth spec.secretTargetRef[0] (awsRoleArn)"));
    assert!(has_note(
        &r,
        "TriggerAuthentication shop/sqs-auth spec.secretTargetRef[1] (awsAccessKeyID)",
        "static AWS keys are not used"
    ));
}

#[test]
fn aws_eks_means_the_workloads_role_unless_keda_used_its_own() {
    let auth = "
apiVersion: keda.sh/v1alpha1
kind: TriggerAuthentication
metadata: {name: sqs-auth}
spec:
  podIdentity: {provider: aws-eks}
";
    let r = ok(
        &with_auth(auth, "TriggerAuthentication"),
        Options::default(),
    );
    assert!(
        r.consumers[0]
            .todos
            .contains(&"spec.aws.roleArn".to_string())
    );
    let owner_operator = with_auth(auth, "TriggerAuthentication").replace(
        "      queueURL:",
        "      identityOwner: operator\n      queueURL:",
    );
    let r = ok(&owner_operator, Options::default());
    assert!(
        !r.consumers[0]
            .todos
            .contains(&"spec.aws.roleArn".to_string())
    );
}

#[test]
fn several_queues_make_one_worker_each_and_are_refused_in_scale_only_mode() {
    let text = "
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {name: orders, namespace: shop}
spec:
  scaleTargetRef: {name: orders}
  triggers:
  - type: aws-sqs-queue
    metadata: {queueURL: \"https://sqs.eu-west-1.amazonaws.com/123456789012/orders_High.fifo\"}
  - type: cpu
    metadata: {value: \"60\"}
  - type: aws-sqs-queue
    name: low
    metadata: {queueURL: \"https://sqs.eu-west-1.amazonaws.com/123456789012/orders-low\"}
";
    let e = errors(text, Options::default());
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].contains("spec.triggers: 2 aws-sqs-queue triggers (triggers[0], triggers[2])"),
        "{e:#?}"
    );
    assert!(e[0].contains("--with-worker"), "{e:#?}");
    let r = ok(
        text,
        Options {
            with_worker: true,
            ..Options::default()
        },
    );
    let names: Vec<String> = r.consumers.iter().map(Imported::name).collect();
    assert_eq!(names, ["shop/orders-orders-high-fifo", "shop/orders-low"]);
    for qc in &r.consumers {
        assert_eq!(qc.consumer.spec.mode(), Mode::Worker);
        assert_eq!(
            qc.todos,
            ["spec.processing.p99", "spec.handler", "spec.template"]
        );
    }
    assert!(has_note(&r, "spec.triggers[1] (type cpu)", "not mapped"));
}

#[test]
fn with_worker_a_name_shared_with_the_deployment_is_noted() {
    let text = SO.replace("orders-consumer", "orders");
    let r = ok(
        &text,
        Options {
            with_worker: true,
            ..Options::default()
        },
    );
    assert!(
        has_note(&r, "metadata.name", "DeploymentNotOwned"),
        "{:#?}",
        notes(&r)
    );
    let qc = &r.consumers[0];
    let http = qc
        .consumer
        .spec
        .handler
        .http
        .as_ref()
        .expect("http handler");
    assert_eq!((http.port, http.path.as_str()), (8080, "/messages"));
    assert!(qc.consumer.spec.template.spec.is_none());
    assert!(
        qc.yaml
            .contains("kubectl get deployment orders -n shop -o jsonpath='{.spec.template}'"),
        "{}",
        qc.yaml
    );
}

#[test]
fn a_scaled_object_without_an_sqs_trigger_is_skipped_with_a_note() {
    let text = format!(
        "{SO}---
apiVersion: keda.sh/v1alpha1
kind: ScaledObject
metadata: {{name: web}}
spec:
  scaleTargetRef: {{name: web}}
  triggers: [{{type: cpu, metadata: {{value: \"50\"}}}}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {{name: web}}
"
    );
    let r = ok(&text, Options::default());
    assert_eq!(r.consumers.len(), 1);
    assert_eq!(r.scaled_objects, 2);
    assert_eq!(r.other_documents, 1);
    assert!(r.notes.iter().any(|n| n.at == "so.yaml, document 2: ScaledObject web"
        && n.field == "spec.triggers"
        && n.message == "skipped: no aws-sqs-queue trigger (types: cpu); a QueueConsumer scales from an SQS queue"));
    // only skipped ones: nothing to import
    let e = errors(
        &text.replacen("aws-sqs-queue", "aws-sqs", 1),
        Options::default(),
    );
    assert!(e[0].contains("nothing to import"), "{e:#?}");
}

#[test]
fn a_kubectl_list_is_read_item_by_item() {
    let text = "
apiVersion: v1
kind: List
items:
- apiVersion: keda.sh/v1alpha1
  kind: TriggerAuthentication
  metadata: {name: sqs-auth, namespace: shop}
  spec: {podIdentity: {provider: aws, roleArn: \"arn:aws:iam::123456789012:role/x\"}}
- apiVersion: keda.sh/v1alpha1
  kind: ScaledObject
  metadata: {name: orders, namespace: shop, uid: abc, resourceVersion: \"1\"}
  spec:
    scaleTargetRef: {name: orders}
    triggers:
    - type: aws-sqs-queue
      authenticationRef: {name: sqs-auth}
      metadata: {queueURL: \"https://sqs.eu-west-1.amazonaws.com/123456789012/orders\"}
  status: {hpaName: keda-hpa-orders}
";
    let r = ok(text, Options::default());
    assert_eq!(
        r.consumers[0].origin.to_string(),
        "so.yaml, document 1, items[1]"
    );
    assert!(r.consumers[0].consumer.spec.aws.role_arn.is_some());
}

#[test]
fn bad_input_names_the_file_document_field_and_fix() {
    for (text, want) in [
        (
            "key: [unclosed",
            "so.yaml: not valid YAML (give KEDA objects as YAML",
        ),
        ("just text", "so.yaml, document 1: not a Kubernetes object"),
        ("", "so.yaml: no YAML documents"),
        (
            &SO.replace("{name: orders-consumer}", "{kind: Deployment}") as &str,
            "so.yaml, document 1: ScaledObject shop/orders: spec.scaleTargetRef.name: required",
        ),
        (
            &SO.replace("  scaleTargetRef: {name: orders-consumer}\n", ""),
            "spec.scaleTargetRef: required",
        ),
        (
            &SO.replace("{name: orders-consumer}", "{name: Orders_Consumer}"),
            "spec.scaleTargetRef.name: \"Orders_Consumer\" is not a Kubernetes object name",
        ),
        (
            &SO.replace(
                "queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                "queueLength: \"5\"",
            ),
            "spec.triggers[0].metadata.queueURL: required: the queue's URL",
        ),
        (
            &SO.replace(
                "queueURL: https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                "queueURLFromEnv: QUEUE_URL",
            ),
            "spec.triggers[0].metadata.queueURLFromEnv: \"QUEUE_URL\" names an environment variable",
        ),
        (
            &SO.replace(
                "https://sqs.eu-west-1.amazonaws.com/123456789012/orders",
                "orders",
            ),
            "`aws sqs get-queue-url --queue-name orders --region eu-west-1` prints it",
        ),
        (
            &SO.replace("awsRegion: eu-west-1", "awsRegion: Europe"),
            "spec.triggers[0].metadata.awsRegion: \"Europe\" is not an AWS region",
        ),
        (
            &SO.replace("awsRegion: eu-west-1", "queueLength: five"),
            "spec.triggers[0].metadata.queueLength: \"five\": give a whole number",
        ),
        (
            &SO.replace("awsRegion: eu-west-1", "scaleOnInFlight: maybe"),
            "spec.triggers[0].metadata.scaleOnInFlight: \"maybe\": write true or false",
        ),
        (
            &with("  minReplicaCount: 5\n  maxReplicaCount: 2", ""),
            "spec.minReplicaCount: 5 exceeds maxReplicaCount 2",
        ),
        (
            &with("  maxReplicaCount: \"10\"", ""),
            "spec.maxReplicaCount: expected a whole number, found \"10\"",
        ),
        (
            &with("  pollingInterval: 0", ""),
            "spec.pollingInterval: 0 is out of range",
        ),
        (
            &with("  idleReplicaCount: 0", ""),
            "spec.idleReplicaCount: 0 is not below minReplicaCount 0, which KEDA refuses too",
        ),
        (&SO.replace("name: orders, ", ""), "metadata.name: required"),
    ] {
        let e = errors(text, Options::default());
        assert!(e.iter().any(|e| e.contains(want)), "{want:?} not in {e:#?}");
    }
}

#[test]
fn a_bad_role_arn_is_refused_at_its_field() {
    let e = errors(
        &with_auth(
            &AUTH_AWS.replace(
                "arn:aws:iam::123456789012:role/orders-scaler",
                "orders-scaler",
            ),
            "TriggerAuthentication",
        ),
        Options::default(),
    );
    assert!(
        e[0].contains("TriggerAuthentication shop/sqs-auth spec.podIdentity.roleArn: \"orders-scaler\" is not an IAM role ARN"),
        "{e:#?}"
    );
}

#[test]
fn go_bool_reads_what_strconv_parse_bool_reads() {
    for (s, want) in [
        ("1", Some(true)),
        ("t", Some(true)),
        ("TRUE", Some(true)),
        ("True", Some(true)),
        ("0", Some(false)),
        ("F", Some(false)),
        ("false", Some(false)),
        ("yes", None),
        ("tRuE", None),
        ("", None),
    ] {
        assert_eq!(go_bool(s), want, "{s:?}");
    }
}

#[test]
fn names_are_dns_labels() {
    assert_eq!(
        dns_label("orders-orders_High.fifo"),
        "orders-orders-high-fifo"
    );
    assert_eq!(dns_label("--a__b--"), "a-b");
    assert_eq!(dns_label(&"x".repeat(80)).len(), 63);
    assert_eq!(dns_label(&format!("{}-y", "x".repeat(62))), "x".repeat(62));
    assert_eq!(
        queue_name("https://sqs.eu-west-1.amazonaws.com/1/orders/"),
        "orders"
    );
    let q = |name: Option<&str>| QueueSettings {
        path: String::new(),
        trigger_name: name.map(str::to_string),
        url: "https://sqs.eu-west-1.amazonaws.com/1/orders".into(),
        region: None,
        endpoint: None,
        queue_length: None,
        activation: None,
        scale_on_in_flight: None,
        identity: Identity::Own,
    };
    let mut taken = BTreeSet::new();
    assert_eq!(consumer_name("so", &q(None), &mut taken), "so-orders");
    assert_eq!(consumer_name("so", &q(None), &mut taken), "so-orders-2");
    assert_eq!(consumer_name("so", &q(Some("High")), &mut taken), "so-high");
}

#[test]
fn the_crd_patterns_are_checked_as_the_api_server_would() {
    for (s, want) in [
        ("eu-west-1", true),
        ("us-gov-west-1", true),
        ("eu-west", false),
        ("EU-west-1", false),
        ("e-west-1", false),
        ("eu--1", false),
    ] {
        assert_eq!(is_region(s), want, "{s}");
    }
    for (s, want) in [
        ("arn:aws:iam::123456789012:role/x", true),
        ("arn:aws-cn:iam::123456789012:role/a/b+c=d,e.f@g_h-i", true),
        ("arn:aws-us-gov:iam::123456789012:role/x", true),
        ("arn:aws:iam::12345678901:role/x", false),
        ("arn:aws:iam::123456789012:user/x", false),
        ("arn:aws:iam::123456789012:role/", false),
        ("arn:awsx:iam::123456789012:role/x", false),
        ("arn:aws:sts::123456789012:role/x", false),
    ] {
        assert_eq!(is_role_arn(s), want, "{s}");
    }
    for (s, want) in [
        ("https://sqs.eu-west-1.amazonaws.com/1/q", true),
        ("http://localhost:4566", true),
        ("https://", false),
        ("ftp://x", false),
        ("https://a b", false),
    ] {
        assert_eq!(is_http_url(s), want, "{s}");
    }
    for (s, want) in [
        ("apps/v1", true),
        ("v1", true),
        ("argoproj.io/v1alpha1", true),
        ("keda.sh/v2beta3", true),
        ("apps/1", false),
        ("Apps/v1", false),
        ("apps/v1gamma1", false),
        ("apps/v1alpha", false),
        ("/v1", false),
    ] {
        assert_eq!(is_api_version(s), want, "{s}");
    }
    assert!(is_kind("StatefulSet") && !is_kind("deployment") && !is_kind("Roll-out"));
    assert!(is_dns_subdomain("a.b-c") && !is_dns_subdomain("-a") && !is_dns_subdomain("a."));
}
