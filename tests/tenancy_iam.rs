//! `spec.aws.roleArn` against a moto that enforces IAM (#28 item 6): a moto of its own, started with
//! `INITIAL_NO_AUTH_ACTION_COUNT` set to exactly the requests that create its users, role, policies and
//! queues; every request after those is authenticated and authorized, the role's trust policy (with its
//! ExternalId condition) and resource-level SQS permissions included. The controller's path is
//! `qc-operator plan --live` (the same provider, clients and AssumeRole as `run`), the worker's the
//! `qc-worker` binary, each with credentials that may do nothing but assume the role.

#[path = "common/mod.rs"]
mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_sqs::types::QueueAttributeName;

const ACCOUNT: &str = "123456789012";
const ROLE: &str = "arn:aws:iam::123456789012:role/qc-team-a-orders";

/// A moto whose first `free` requests go unauthenticated.
struct IamMoto {
    endpoint: String,
    _moto: common::OwnMoto,
}

impl IamMoto {
    fn start(free: usize) -> IamMoto {
        let moto =
            common::OwnMoto::start(&[], &[("INITIAL_NO_AUTH_ACTION_COUNT", &free.to_string())]);
        IamMoto {
            endpoint: format!("http://127.0.0.1:{}", moto.port),
            _moto: moto,
        }
    }

    /// One query-protocol request of the set-up (signed with any key: not checked yet), its XML answer.
    fn setup(&self, service: &str, params: &[(&str, &str)]) -> String {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--fail-with-body", "--aws-sigv4"])
            .arg(format!("aws:amz:us-east-1:{service}"))
            .args(["--user", "testing:testing"]);
        for (k, v) in params {
            cmd.arg("--data-urlencode").arg(format!("{k}={v}"));
        }
        let out = cmd
            .arg(format!("{}/", self.endpoint))
            .output()
            .expect("curl runs");
        let body = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{service} {params:?}: {body}");
        body
    }
}

fn between<'a>(xml: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let start = xml
        .find(&open)
        .unwrap_or_else(|| panic!("no {tag} in {xml}"))
        + open.len();
    let end = xml[start..].find('<').unwrap() + start;
    &xml[start..end]
}

struct Keys {
    id: String,
    secret: String,
}

/// Set-up, exactly `SETUP_REQUESTS` requests: users `qc-operator` (the controller) and `pods` (the
/// worker pods) that may only assume `qc-*` roles, an `admin` for the test's own SQS calls, the role
/// `qc-team-a-orders` (trusting both, with ExternalId `qc:team-a` only) allowed team-a's queues only,
/// and the queues `team-a-orders` and `team-b-orders`.
const SETUP_REQUESTS: usize = 13;

fn user(moto: &IamMoto, name: &str, policy: &serde_json::Value) -> Keys {
    moto.setup(
        "iam",
        &[
            ("Action", "CreateUser"),
            ("Version", "2010-05-08"),
            ("UserName", name),
        ],
    );
    let xml = moto.setup(
        "iam",
        &[
            ("Action", "CreateAccessKey"),
            ("Version", "2010-05-08"),
            ("UserName", name),
        ],
    );
    moto.setup(
        "iam",
        &[
            ("Action", "PutUserPolicy"),
            ("Version", "2010-05-08"),
            ("UserName", name),
            ("PolicyName", "p"),
            ("PolicyDocument", &policy.to_string()),
        ],
    );
    Keys {
        id: between(&xml, "AccessKeyId").to_string(),
        secret: between(&xml, "SecretAccessKey").to_string(),
    }
}

fn statement(action: serde_json::Value, resource: &str) -> serde_json::Value {
    serde_json::json!({"Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": action, "Resource": resource}]})
}

struct World {
    moto: IamMoto,
    operator: Keys,
    pods: Keys,
    admin: Keys,
    team_a: String,
    team_b: String,
}

fn world() -> World {
    let moto = IamMoto::start(SETUP_REQUESTS);
    let assume = statement(
        serde_json::json!("sts:AssumeRole"),
        "arn:aws:iam::*:role/qc-*",
    );
    let operator = user(&moto, "qc-operator", &assume);
    let pods = user(&moto, "pods", &assume);
    let admin = user(&moto, "admin", &statement(serde_json::json!("*"), "*"));
    let trust = serde_json::json!({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow",
        "Principal": {"AWS": [format!("arn:aws:iam::{ACCOUNT}:user/qc-operator"),
                              format!("arn:aws:iam::{ACCOUNT}:user/pods")]},
        "Action": "sts:AssumeRole",
        "Condition": {"StringEquals": {"sts:ExternalId": "qc:team-a"}}}]});
    moto.setup(
        "iam",
        &[
            ("Action", "CreateRole"),
            ("Version", "2010-05-08"),
            ("RoleName", "qc-team-a-orders"),
            ("AssumeRolePolicyDocument", &trust.to_string()),
        ],
    );
    // The docs' worker statements; moto authorizes the batch calls by their own names (AWS by the
    // single-message actions), so those are added for it.
    let queues = serde_json::json!([
        "sqs:GetQueueAttributes",
        "sqs:GetQueueUrl",
        "sqs:ReceiveMessage",
        "sqs:DeleteMessage",
        "sqs:ChangeMessageVisibility",
        "sqs:DeleteMessageBatch",
        "sqs:ChangeMessageVisibilityBatch"
    ]);
    moto.setup(
        "iam",
        &[
            ("Action", "PutRolePolicy"),
            ("Version", "2010-05-08"),
            ("RoleName", "qc-team-a-orders"),
            ("PolicyName", "team-a-queues"),
            (
                "PolicyDocument",
                &statement(queues, &format!("arn:aws:sqs:us-east-1:{ACCOUNT}:team-a-*"))
                    .to_string(),
            ),
        ],
    );
    let queue = |name: &str| {
        let xml = moto.setup("sqs", &[("Action", "CreateQueue"), ("QueueName", name)]);
        between(&xml, "QueueUrl").to_string()
    };
    let team_a = queue("team-a-orders");
    let team_b = queue("team-b-orders");
    World {
        moto,
        operator,
        pods,
        admin,
        team_a,
        team_b,
    }
}

/// `qc-operator plan --live` of QueueConsumer `namespace/orders` on `url` as `keys`: (succeeded to
/// read the queue, everything it printed).
fn plan(w: &World, keys: &Keys, namespace: &str, url: &str, role: Option<&str>) -> (bool, String) {
    let (_, text) = live(w, "plan", keys, namespace, url, role);
    (text.contains("reason: QueueAttributesRead"), text)
}

/// `qc-operator COMMAND --live` (check or plan) of QueueConsumer `namespace/orders` on `url` as `keys`:
/// (its exit code, everything it printed).
fn live(
    w: &World,
    command: &str,
    keys: &Keys,
    namespace: &str,
    url: &str,
    role: Option<&str>,
) -> (Option<i32>, String) {
    let dir = std::env::temp_dir().join(format!("qc-tenancy-iam-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join(format!(
        "{namespace}-{}.yaml",
        url.rsplit('/').next().unwrap()
    ));
    let aws = role.map_or(String::new(), |r| format!("  aws: {{roleArn: '{r}'}}\n"));
    std::fs::write(
        &file,
        format!(
            "apiVersion: sqs.consumers.dev/v1alpha1\nkind: QueueConsumer\nmetadata: {{name: orders, namespace: {namespace}}}\nspec:\n{aws}  queue: {{url: '{url}', endpoint: '{}', region: us-east-1}}\n  processing: {{p99: 1s}}\n  handler: {{http: {{}}}}\n  deadLetter: {{alarm: false}}\n  template: {{spec: {{containers: [{{name: app, image: x}}]}}}}\n",
            w.moto.endpoint
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_qc-operator"))
        .args([command, "--live", "--allowed-endpoint", &w.moto.endpoint])
        .arg(&file)
        .env("AWS_ACCESS_KEY_ID", &keys.id)
        .env("AWS_SECRET_ACCESS_KEY", &keys.secret)
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env("AWS_MAX_ATTEMPTS", "1")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

async fn sqs_as(w: &World, keys: &Keys) -> aws_sdk_sqs::Client {
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(&w.moto.endpoint)
        .http_client(qc::aws::http_client())
        .credentials_provider(aws_credential_types::Credentials::new(
            &keys.id,
            &keys.secret,
            None,
            None,
            "test",
        ))
        .load()
        .await;
    aws_sdk_sqs::Client::new(&conf)
}

#[tokio::test]
async fn a_role_reaches_its_own_queue_only_for_the_controller_and_the_worker() {
    let w = world();

    // The controller's credentials alone read nothing: whatever it reads below, it reads as the role.
    let (read, out) = plan(&w, &w.operator, "team-a", &w.team_a, None);
    assert!(
        !read,
        "without a role the controller's own identity may not read: {out}"
    );
    assert!(
        out.contains("AccessDenied") || out.contains("not authorized"),
        "{out}"
    );

    // team-a's QueueConsumer with team-a's role reads team-a's queue.
    let (read, out) = plan(&w, &w.operator, "team-a", &w.team_a, Some(ROLE));
    assert!(read, "the role reads its own queue: {out}");

    // The same role pointed at another team's queue: AWS refuses, and the refusal names the call.
    let (read, out) = plan(&w, &w.operator, "team-a", &w.team_b, Some(ROLE));
    assert!(!read, "{out}");
    assert!(
        out.contains("access to queue") && out.contains("team-b-orders was denied"),
        "reported clearly: {out}"
    );

    // Another namespace naming team-a's role: its ExternalId (qc:team-b) fails the trust policy.
    let (read, out) = plan(&w, &w.operator, "team-b", &w.team_a, Some(ROLE));
    assert!(!read, "the trust policy pins the role to team-a: {out}");
    assert!(
        out.contains("credentials") && out.contains("team-a-orders"),
        "reported as the credentials (AssumeRole) failing for that queue: {out}"
    );

    // `check --live` reads as the controller would: through the role, with the manifest's namespace's
    // ExternalId; the machine's own identity reads nothing.
    let (code, out) = live(&w, "check", &w.operator, "team-a", &w.team_a, Some(ROLE));
    assert!(
        code != Some(2) && !out.contains("AccessDenied") && !out.contains("credentials"),
        "check --live reads team-a's queue as the role: {code:?} {out}"
    );
    let (code, out) = live(&w, "check", &w.operator, "team-a", &w.team_a, None);
    assert_eq!(code, Some(2), "without the role nothing is read: {out}");
    let (code, out) = live(&w, "check", &w.operator, "team-b", &w.team_a, Some(ROLE));
    assert_eq!(code, Some(2), "qc:team-b fails the trust policy: {out}");
    assert!(out.contains("credentials"), "{out}");

    // The worker, with pod credentials that may only assume the role, consumes team-a's queue.
    let admin = sqs_as(&w, &w.admin).await;
    admin
        .send_message()
        .queue_url(&w.team_a)
        .message_body("hello")
        .send()
        .await
        .unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_qc-worker"))
        .args(["--queue-url", &w.team_a, "--endpoint-url", &w.moto.endpoint])
        .args(["--region", "us-east-1", "--role-arn", ROLE])
        .args([
            "--role-session-name",
            "qc-team-a.orders",
            "--role-external-id",
            "qc:team-a",
        ])
        .args(["--wait-time", "1s", "--metrics-addr", "127.0.0.1:0"])
        .args(["--exec", "--", "true"])
        .env("AWS_ACCESS_KEY_ID", &w.pods.id)
        .env("AWS_SECRET_ACCESS_KEY", &w.pods.secret)
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let left = loop {
        let a = admin
            .get_queue_attributes()
            .queue_url(&w.team_a)
            .attribute_names(QueueAttributeName::All)
            .send()
            .await
            .unwrap();
        let attrs = a.attributes.unwrap_or_default();
        let n = |k: QueueAttributeName| {
            attrs
                .get(&k)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        };
        let left = n(QueueAttributeName::ApproximateNumberOfMessages)
            + n(QueueAttributeName::ApproximateNumberOfMessagesNotVisible);
        if left == 0 || Instant::now() > deadline {
            break left;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    let _ = worker.kill();
    let out = worker.wait_with_output().unwrap();
    assert_eq!(
        left,
        0,
        "the worker consumed the message as the role:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
