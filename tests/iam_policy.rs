//! The IAM policies docs/security.md documents are exactly what the code calls. The README holds no
//! copy of them (it links there), so there is one policy per side to keep right.
//!
//! The list of calls is derived from the source, not written down here: every SDK fluent call
//! (`.get_queue_attributes()`, `.put_metric_alarm()`, ...) in the non-test code of `src/` is an
//! AWS operation, attributed to the worker (`src/worker/`) or the controller (everything else).
//! Each documented policy must allow every action its side calls, and allow nothing its side does
//! not call. So adding an SDK call without adding its action to the policies fails this test, and
//! so does a policy that asks for more than the code uses.
//!
//! The operation names below are the complete operation lists of aws-sdk-sqs, aws-sdk-cloudwatch and
//! aws-sdk-sts (their `src/operation/` modules), so a call to any operation of these services is seen;
//! for S3 and DynamoDB, the operations a worker could plausibly call.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const SQS_OPERATIONS: &[&str] = &[
    "add_permission",
    "cancel_message_move_task",
    "change_message_visibility",
    "change_message_visibility_batch",
    "create_queue",
    "delete_message",
    "delete_message_batch",
    "delete_queue",
    "get_queue_attributes",
    "get_queue_url",
    "list_dead_letter_source_queues",
    "list_message_move_tasks",
    "list_queue_tags",
    "list_queues",
    "purge_queue",
    "receive_message",
    "remove_permission",
    "send_message",
    "send_message_batch",
    "set_queue_attributes",
    "start_message_move_task",
    "tag_queue",
    "untag_queue",
];

const CLOUDWATCH_OPERATIONS: &[&str] = &[
    "delete_alarms",
    "delete_anomaly_detector",
    "delete_dashboards",
    "delete_insight_rules",
    "delete_metric_stream",
    "describe_alarm_contributors",
    "describe_alarm_history",
    "describe_alarms",
    "describe_alarms_for_metric",
    "describe_anomaly_detectors",
    "describe_insight_rules",
    "disable_alarm_actions",
    "disable_insight_rules",
    "enable_alarm_actions",
    "enable_insight_rules",
    "get_dashboard",
    "get_insight_rule_report",
    "get_metric_data",
    "get_metric_statistics",
    "get_metric_stream",
    "get_metric_widget_image",
    "list_dashboards",
    "list_managed_insight_rules",
    "list_metric_streams",
    "list_metrics",
    "list_tags_for_resource",
    "put_anomaly_detector",
    "put_composite_alarm",
    "put_dashboard",
    "put_insight_rule",
    "put_managed_insight_rules",
    "put_metric_alarm",
    "put_metric_data",
    "put_metric_stream",
    "set_alarm_state",
    "start_metric_streams",
    "stop_metric_streams",
    "tag_resource",
    "untag_resource",
];

const STS_OPERATIONS: &[&str] = &[
    "assume_role",
    "assume_role_with_saml",
    "assume_role_with_web_identity",
    "assume_root",
    "decode_authorization_message",
    "get_access_key_info",
    "get_caller_identity",
    "get_federation_token",
    "get_session_token",
];

/// The S3 operations a worker could call (`handler.s3Payloads`); the scanner looks for these.
const S3_OPERATIONS: &[&str] = &[
    "copy_object",
    "create_bucket",
    "delete_object",
    "delete_objects",
    "get_object",
    "head_object",
    "list_objects_v2",
    "put_object",
];

/// The DynamoDB operations a worker could call (`idempotency.store: dynamodb`): the item and table
/// operations of aws-sdk-dynamodb the scanner looks for.
const DYNAMODB_OPERATIONS: &[&str] = &[
    "batch_get_item",
    "batch_write_item",
    "create_table",
    "delete_item",
    "delete_table",
    "describe_table",
    "describe_time_to_live",
    "get_item",
    "put_item",
    "transact_get_items",
    "transact_write_items",
    "update_item",
    "update_table",
    "update_time_to_live",
];

/// `get_queue_attributes` -> `GetQueueAttributes`.
fn pascal(snake: &str) -> String {
    snake
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// The IAM actions one SDK operation needs. The batch operations are authorised by the single
/// action; a PutMetricAlarm with tags (the controller always tags its alarm) also needs TagResource,
/// and a CreateQueue with tags (`queue.manage: create` tags what it creates) TagQueue.
fn actions_for(service: &str, op: &str, source: &str) -> Vec<String> {
    let action = op.strip_suffix("_batch").unwrap_or(op);
    let mut out = vec![format!("{service}:{}", pascal(action))];
    if op == "put_metric_alarm" && source.contains(".tags(") {
        out.push("cloudwatch:TagResource".to_owned());
    }
    if op == "create_queue" && source.contains(".tags(") {
        out.push("sqs:TagQueue".to_owned());
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The non-test part of a source file: everything before its `#[cfg(test)]` module.
fn non_test(source: &str) -> &str {
    source
        .find("#[cfg(test)]\nmod ")
        .map_or(source, |i| &source[..i])
}

/// The SDK calls in `source`: `.op()` for every known operation name (fluent builders take no
/// arguments, so a trait method of the same name with arguments is not counted).
fn calls(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (service, ops) in [
        ("sqs", SQS_OPERATIONS),
        ("cloudwatch", CLOUDWATCH_OPERATIONS),
        ("sts", STS_OPERATIONS),
        ("s3", S3_OPERATIONS),
        ("dynamodb", DYNAMODB_OPERATIONS),
    ] {
        for op in ops {
            if source.contains(&format!(".{op}()")) {
                found.extend(actions_for(service, op, source));
            }
        }
    }
    // `spec.aws.roleArn`: the SDK's AssumeRoleProvider calls AssumeRole, and whoever wraps a config
    // with it (`identity::assume`) makes that call as itself.
    if source.contains("AssumeRoleProvider::builder(") || source.contains("identity::assume(") {
        found.insert("sts:AssumeRole".to_owned());
    }
    found
}

/// (controller actions, worker actions) the code calls.
fn called_actions() -> (BTreeSet<String>, BTreeSet<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let (mut controller, mut worker) = (BTreeSet::new(), BTreeSet::new());
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read source");
        let found = calls(non_test(&text));
        if file.starts_with(root.join("src/worker")) || file.ends_with("src/bin/qc-worker.rs") {
            worker.extend(found);
        } else {
            controller.extend(found);
        }
    }
    (controller, worker)
}

/// Where the policies are documented, one controller policy and one worker policy.
const POLICY_DOC: &str = "docs/security.md";

/// The ```json blocks of a document that hold an `"Action"`: identity policies. A trust or resource
/// policy (one naming a `"Principal"`) grants nothing to the operator's own code and is left out.
fn json_blocks(doc: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = doc;
    while let Some(start) = rest.find("```json\n") {
        let body = &rest[start + "```json\n".len()..];
        let end = body.find("```").expect("unterminated ```json block");
        if body[..end].contains("\"Action\"") && !body[..end].contains("\"Principal\"") {
            blocks.push(body[..end].to_owned());
        }
        rest = &body[end + 3..];
    }
    blocks
}

/// The actions a policy document (or a comma-separated list of statements) allows.
fn allowed_actions(block: &str, what: &str) -> BTreeSet<String> {
    let value: serde_json::Value = serde_json::from_str(block)
        .or_else(|_| serde_json::from_str(&format!("[{block}]")))
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{block}"));
    let statements = match &value {
        serde_json::Value::Object(o) if o.contains_key("Statement") => o["Statement"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: Statement is not a list"))
            .clone(),
        serde_json::Value::Array(a) => a.clone(),
        other => vec![other.clone()],
    };
    let mut actions = BTreeSet::new();
    for s in statements {
        assert_eq!(
            s["Effect"], "Allow",
            "{what}: only Allow statements expected"
        );
        match &s["Action"] {
            serde_json::Value::String(a) => {
                actions.insert(a.clone());
            }
            serde_json::Value::Array(list) => {
                for a in list {
                    actions.insert(a.as_str().expect("action is a string").to_owned());
                }
            }
            other => panic!("{what}: Action is {other}"),
        }
    }
    actions
}

/// (controller policy, worker policy) of a document: the full policy (with `"Version"`) is the
/// controller's, the bare statements the worker's.
fn documented(path: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join(path)).expect("read doc");
    let blocks = json_blocks(&doc);
    let (full, bare): (Vec<_>, Vec<_>) = blocks.iter().partition(|b| b.contains("\"Version\""));
    assert_eq!(
        (full.len(), bare.len()),
        (1, 1),
        "{path}: expected one controller policy (with \"Version\") and one worker policy"
    );
    (
        allowed_actions(full[0], &format!("{path} controller policy")),
        allowed_actions(bare[0], &format!("{path} worker policy")),
    )
}

/// The controller and worker policies of `POLICY_DOC` allow exactly these actions; `source` ends
/// each problem's name (where the actions came from).
fn assert_policies_allow_exactly(
    controller: &BTreeSet<String>,
    worker: &BTreeSet<String>,
    source: &str,
) {
    let mut problems = Vec::new();
    let doc = POLICY_DOC;
    let (c, w) = documented(doc);
    diff(
        &format!("{doc}: the controller policy{source}"),
        controller,
        &c,
        &mut problems,
    );
    diff(
        &format!("{doc}: the worker policy{source}"),
        worker,
        &w,
        &mut problems,
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

fn diff(
    what: &str,
    called: &BTreeSet<String>,
    allowed: &BTreeSet<String>,
    problems: &mut Vec<String>,
) {
    let missing: Vec<_> = called.difference(allowed).collect();
    let unused: Vec<_> = allowed.difference(called).collect();
    if !missing.is_empty() {
        problems.push(format!(
            "{what} lacks {missing:?}, which the code calls: add them to the policy"
        ));
    }
    if !unused.is_empty() {
        problems.push(format!(
            "{what} allows {unused:?}, which no code calls: remove them (or the test's \
             operation lists are out of date)"
        ));
    }
}

#[test]
fn the_code_calls_the_operations_this_test_expects_to_find() {
    // A guard on the scanner itself: if it found nothing, every policy would look "too wide".
    let (controller, worker) = called_actions();
    for a in [
        "sqs:GetQueueAttributes",
        "cloudwatch:PutMetricAlarm",
        "cloudwatch:ListTagsForResource",
        "sqs:SetQueueAttributes",
        "sqs:CreateQueue",
        "sqs:TagQueue",
    ] {
        assert!(
            controller.contains(a),
            "controller calls {a}: {controller:?}"
        );
    }
    assert!(
        controller.contains("sts:AssumeRole"),
        "controller assumes spec.aws.roleArn: {controller:?}"
    );
    for a in [
        "sqs:ReceiveMessage",
        "sqs:SendMessage",
        "sts:AssumeRole",
        "s3:GetObject",
        "s3:DeleteObject",
    ] {
        assert!(worker.contains(a), "worker calls {a}: {worker:?}");
    }
}

#[test]
fn documented_iam_policies_allow_exactly_what_the_code_calls() {
    let (controller, worker) = called_actions();
    assert_policies_allow_exactly(&controller, &worker, "");
}

#[test]
fn the_readme_links_to_the_policies_instead_of_copying_them() {
    // A copy in the README would be a second policy per side that nothing here checks.
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md");
    assert!(
        json_blocks(&readme).is_empty(),
        "README.md holds an IAM policy: link to {POLICY_DOC} instead, where this test checks it"
    );
    assert!(
        readme.contains("](docs/security.md#aws-iam)"),
        "README.md should link to the policies in {POLICY_DOC}#aws-iam"
    );
}

#[test]
fn the_chart_names_every_controller_action_it_mentions_correctly() {
    // The chart's NOTES and values name actions in prose; each one named must be a real call.
    let (controller, _) = called_actions();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for file in [
        "charts/queue-consumer-operator/templates/NOTES.txt",
        "charts/queue-consumer-operator/values.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).expect("read chart file");
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == ':')) {
            if let Some((svc, _)) = word.split_once(':')
                && ["sqs", "cloudwatch", "sts"].contains(&svc)
                && word.len() > svc.len() + 1
            {
                assert!(
                    controller.contains(word),
                    "{file} names {word}, which the controller never calls"
                );
            }
        }
    }
}

// ---- The calls the tests actually made (#28 item 5) ----------------------------------------------
//
// `scripts/test` runs moto with its recorder on (`QC_MOTO_RECORDING`: every request, headers and
// body, one JSON line each) through the whole test run, then runs the test below on the recording.
// The worker's calls carry `app/qc-worker` in their x-amz-user-agent, the controller's `app/qc-operator`
// (`qc::aws::WORKER_APP_NAME`, `OPERATOR_APP_NAME`; the controller's readers and writers tag the
// clients they are given); the tests' own set-up calls carry neither and are left out.

/// The IAM actions one recorded request needs, and who made it ("worker", "controller"), if ours.
fn recorded_request(line: &str) -> Option<(&'static str, Vec<String>)> {
    let e: serde_json::Value = serde_json::from_str(line).ok()?;
    let header = |name: &str| -> String {
        e["headers"]
            .as_object()
            .and_then(|h| {
                h.iter()
                    .find(|(k, _)| k.eq_ignore_ascii_case(name))
                    .and_then(|(_, v)| v.as_str())
            })
            .unwrap_or_default()
            .to_owned()
    };
    // The SDK puts the app name in x-amz-user-agent (User-Agent holds the short form).
    let agent = header("x-amz-user-agent");
    let who = if agent.contains(&format!("app/{}", qc::aws::WORKER_APP_NAME)) {
        "worker"
    } else if agent.contains(&format!("app/{}", qc::aws::OPERATOR_APP_NAME)) {
        "controller"
    } else {
        return None;
    };
    // The service is the signing scope's: Credential=KEY/DATE/REGION/SERVICE/aws4_request.
    let auth = header("authorization");
    let service = auth
        .split("Credential=")
        .nth(1)
        .and_then(|c| c.split('/').nth(3))
        .unwrap_or_default();
    let body = match e["body"].as_str() {
        Some(b) if e["body_encoded"] == true => {
            use base64::Engine as _;
            String::from_utf8_lossy(
                &base64::engine::general_purpose::STANDARD
                    .decode(b)
                    .unwrap_or_default(),
            )
            .into_owned()
        }
        Some(b) => b.to_owned(),
        None => String::new(),
    };
    let method = e["method"].as_str().unwrap_or_default();
    // JSON protocols name the operation in X-Amz-Target (AmazonSQS.ReceiveMessage); the query
    // protocol (CloudWatch 1.99.x, STS) in the form body's Action; S3 is REST.
    let target = header("x-amz-target");
    let op = if let Some((_, op)) = target.rsplit_once('.') {
        op.to_owned()
    } else if service == "s3" {
        match method {
            "GET" | "HEAD" => "GetObject".to_owned(),
            "DELETE" => "DeleteObject".to_owned(),
            "PUT" => "PutObject".to_owned(),
            other => format!("{other} (unmapped)"),
        }
    } else {
        body.split('&')
            .find_map(|kv| kv.strip_prefix("Action="))
            .unwrap_or("(no action)")
            .to_owned()
    };
    let iam_service = match service {
        "monitoring" => "cloudwatch",
        other => other,
    };
    // A batch call is authorised by its single-message action.
    let action = op.strip_suffix("Batch").unwrap_or(&op);
    let mut actions = vec![format!("{iam_service}:{action}")];
    // Tags on a created alarm or queue need the tagging action too.
    if op == "PutMetricAlarm" && body.contains("Tags.member") {
        actions.push("cloudwatch:TagResource".to_owned());
    }
    if op == "CreateQueue" && body.contains("\"tags\"") {
        actions.push("sqs:TagQueue".to_owned());
    }
    Some((who, actions))
}

/// (controller actions, worker actions) in a recording.
fn recorded_actions(recording: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut controller, mut worker) = (BTreeSet::new(), BTreeSet::new());
    for line in recording.lines() {
        match recorded_request(line) {
            Some(("worker", actions)) => worker.extend(actions),
            Some((_, actions)) => controller.extend(actions),
            None => {}
        }
    }
    (controller, worker)
}

/// Documented actions the recording cannot show, because the tests that make them run against a
/// server of their own (not the recorded one): (who, action, the test that calls it).
const CALLED_ON_OTHER_SERVERS: &[(&str, &str, &str)] = &[
    (
        "worker",
        "sts:AssumeRole",
        "tests/tenancy_iam.rs: qc-worker with --role-arn on a moto of its own that enforces IAM",
    ),
    (
        "controller",
        "sqs:ListMessageMoveTasks",
        "tests/controller_operate.rs: a scripted stand-in in front of moto answers StartMessageMoveTask \
     and ListMessageMoveTasks (moto has neither), so the controller follows a move task only there",
    ),
];

#[test]
fn recorded_requests_are_read_as_their_iam_actions() {
    let line = |agent: &str, scope: &str, target: Option<&str>, method: &str, body: &str| {
        let mut headers = serde_json::json!({
            "X-Amz-User-Agent": agent,
            "Authorization": format!("AWS4-HMAC-SHA256 Credential=AKID/20261206/us-east-1/{scope}/aws4_request, SignedHeaders=host, Signature=0"),
        });
        if let Some(t) = target {
            headers["X-Amz-Target"] = t.into();
        }
        serde_json::json!({"headers": headers, "method": method, "url": "http://h/", "body": body, "body_encoded": false})
            .to_string()
    };
    let worker = "aws-sdk-rust/1 os/linux lang/rust app/qc-worker";
    let operator = "aws-sdk-rust/1 os/linux lang/rust app/qc-operator";
    let rec = [
        line(
            worker,
            "sqs",
            Some("AmazonSQS.DeleteMessageBatch"),
            "POST",
            "{}",
        ),
        line(worker, "s3", None, "GET", ""),
        line(
            operator,
            "monitoring",
            None,
            "POST",
            "Action=PutMetricAlarm&Version=2010-08-01&Tags.member.1.Key=a",
        ),
        line(operator, "sts", None, "POST", "Action=AssumeRole&RoleArn=x"),
        line(
            operator,
            "sqs",
            Some("AmazonSQS.CreateQueue"),
            "POST",
            r#"{"QueueName":"q","tags":{"a":"b"}}"#,
        ),
        // The tests' own calls: no app name.
        line(
            "aws-sdk-rust/1 os/linux",
            "sqs",
            Some("AmazonSQS.PurgeQueue"),
            "POST",
            "{}",
        ),
    ]
    .join("\n");
    let (controller, worker) = recorded_actions(&rec);
    let set = |l: &[&str]| l.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<_>>();
    assert_eq!(worker, set(&["sqs:DeleteMessage", "s3:GetObject"]));
    assert_eq!(
        controller,
        set(&[
            "cloudwatch:PutMetricAlarm",
            "cloudwatch:TagResource",
            "sts:AssumeRole",
            "sqs:CreateQueue",
            "sqs:TagQueue"
        ])
    );
}

/// The documented policies allow exactly the actions the controller and the worker were seen
/// calling during the whole test run (moto's recording), and those seen only on other servers.
#[test]
#[ignore = "reads the recording of a whole test run: scripts/test runs it last (QC_MOTO_RECORDING)"]
fn documented_iam_policies_allow_exactly_the_calls_recorded_during_the_tests() {
    let path = std::env::var("QC_MOTO_RECORDING")
        .expect("QC_MOTO_RECORDING names moto's recording of the test run (scripts/test sets it)");
    let recording = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the recording {path}: {e}"));
    let (mut controller, mut worker) = recorded_actions(&recording);
    assert!(
        !worker.is_empty() && !controller.is_empty(),
        "the recording {path} holds no call of the worker or the controller: was moto started with \
         MOTO_ENABLE_RECORDING?"
    );
    for (who, action, _) in CALLED_ON_OTHER_SERVERS {
        match *who {
            "worker" => worker.insert((*action).to_owned()),
            _ => controller.insert((*action).to_owned()),
        };
    }
    eprintln!("recorded: controller {controller:?}\nrecorded: worker {worker:?}");
    assert_policies_allow_exactly(&controller, &worker, " (against the recording)");
}
