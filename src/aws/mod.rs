//! AWS adapters: SQS queue facts behind a small trait (real SDK and test doubles).
//! `facts` is pure parsing; the SDK-backed adapter lives in `sqs`.

pub mod batch;
pub mod classify;
pub mod cloudwatch;
pub mod endpoints;
pub mod facts;
pub mod identity;
pub mod limit;
pub mod manage;
pub mod redrive;
pub mod sqs;
pub mod triage;

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use aws_smithy_http_client::Connector;
use aws_smithy_http_client::proxy::ProxyConfig;
use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnectorSettings, SharedHttpClient, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;

pub use facts::{DeadLetterFacts, Facts, FactsError, QueueArn, QueueFacts, QueueId, RedrivePolicy};
pub use sqs::{
    ObserveError, QueueReader, SqsError, SqsReader, StaticReader, observe, observe_with,
};

/// Shared SDK configuration: region (explicit, else from the queue URL, else the environment) and an
/// optional endpoint override for local emulators. Credentials come from the default chain; retries
/// (`AWS_RETRY_MODE`, `AWS_MAX_ATTEMPTS`) from the environment or profile; HTTP goes through
/// [`http_client`], so proxies from the environment apply to every AWS call, credentials included.
pub async fn sdk_config(region: Option<&str>, endpoint: Option<&str>) -> aws_config::SdkConfig {
    sdk_config_trusting(region, endpoint, &crate::roots::Roots::System).await
}

/// [`sdk_config`] whose HTTP client trusts `roots` (the worker's: the system's, else the bundle
/// beside qc-worker; see [`crate::roots`]).
pub async fn sdk_config_trusting(
    region: Option<&str>,
    endpoint: Option<&str>,
    roots: &crate::roots::Roots,
) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http_client_trusting(roots));
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region.to_string()));
    }
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

/// The SDK's own HTTP client (hyper, rustls with aws-lc, the system's roots with `SSL_CERT_FILE` and
/// `SSL_CERT_DIR` honoured) with the proxy taken from `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY` and
/// `NO_PROXY` (either case): https endpoints are tunnelled with CONNECT, http ones sent to the proxy.
/// The SDK's default client ignores those variables.
pub fn http_client() -> SharedHttpClient {
    http_client_trusting(&crate::roots::Roots::System)
}

/// [`http_client`] trusting `roots` instead of the system's roots alone.
pub fn http_client_trusting(roots: &crate::roots::Roots) -> SharedHttpClient {
    SharedHttpClient::new(ProxyAwareClient {
        connectors: RwLock::default(),
        tls: roots.tls_context(),
    })
}

/// Builds one connector (with its connection pool) per pair of connect and read timeouts, like the
/// SDK's default client, and reuses it for every request with those settings.
#[derive(Debug)]
struct ProxyAwareClient {
    connectors: RwLock<HashMap<Timeouts, SharedHttpConnector>>,
    /// The trusted roots (the SDK's own trust-store settings).
    tls: tls::TlsContext,
}

/// Connect and read timeouts: what tells one connector from another.
type Timeouts = (Option<Duration>, Option<Duration>);

impl HttpClient for ProxyAwareClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        let key = (settings.connect_timeout(), settings.read_timeout());
        if let Some(c) = self
            .connectors
            .read()
            .ok()
            .and_then(|m| m.get(&key).cloned())
        {
            return c;
        }
        let mut builder = Connector::builder()
            .connector_settings(settings.clone())
            .proxy_config(ProxyConfig::from_env());
        if let Some(sleep) = components.sleep_impl() {
            builder = builder.sleep_impl(sleep);
        }
        let connector = SharedHttpConnector::new(
            builder
                .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc))
                .tls_context(self.tls.clone())
                .build(),
        );
        match self.connectors.write() {
            Ok(mut m) => m.entry(key).or_insert(connector).clone(),
            Err(_) => connector,
        }
    }
}

/// Deadlines of the controller's AWS calls: a silent endpoint (accepts, never answers) costs at most
/// `OPERATION_TIMEOUT` per call, so it can neither hang a reconcile nor the controller's shutdown.
/// The controller never long-polls, so no answer it waits for takes longer than a few seconds.
pub const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);
pub const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
pub const ATTEMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
pub const OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(12);

/// The app name in the user agent of the worker's AWS calls (`app/qc-worker`): CloudTrail's
/// `userAgent` tells the worker's calls from the controller's and from anything else using the same
/// identity, and the IAM policy test tells them apart in moto's recording (tests/iam_policy.rs).
pub const WORKER_APP_NAME: &str = "qc-worker";
/// The app name in the user agent of the controller's AWS calls (`app/qc-operator`).
pub const OPERATOR_APP_NAME: &str = "qc-operator";

/// `conf` whose calls carry `app/<name>` in their user agent.
pub fn with_app_name(conf: aws_config::SdkConfig, name: &str) -> aws_config::SdkConfig {
    match aws_config::AppName::new(name.to_string()) {
        Ok(app) => conf.into_builder().app_name(app).build(),
        // A constant of ours: valid (tested); never worth failing a call over.
        Err(_) => conf,
    }
}

/// `client` whose calls carry the controller's app name, whoever built it: the controller's SQS
/// readers and writers take their clients through this.
pub fn operator_sqs(client: aws_sdk_sqs::Client) -> aws_sdk_sqs::Client {
    match aws_config::AppName::new(OPERATOR_APP_NAME) {
        Ok(app) => {
            aws_sdk_sqs::Client::from_conf(client.config().to_builder().app_name(app).build())
        }
        Err(_) => client,
    }
}

/// [`operator_sqs`] for the controller's CloudWatch client.
pub fn operator_cloudwatch(client: aws_sdk_cloudwatch::Client) -> aws_sdk_cloudwatch::Client {
    match aws_config::AppName::new(OPERATOR_APP_NAME) {
        Ok(app) => aws_sdk_cloudwatch::Client::from_conf(
            client.config().to_builder().app_name(app).build(),
        ),
        Err(_) => client,
    }
}

/// [`operator_sqs`] for the controller's STS client (`manage: create` asks it for the account).
pub fn operator_sts(client: aws_sdk_sts::Client) -> aws_sdk_sts::Client {
    match aws_config::AppName::new(OPERATOR_APP_NAME) {
        Ok(app) => {
            aws_sdk_sts::Client::from_conf(client.config().to_builder().app_name(app).build())
        }
        Err(_) => client,
    }
}

/// `sdk_config` with the controller's deadlines (the worker's long polls need longer reads) and its
/// app name in the user agent.
pub async fn controller_sdk_config(
    region: Option<&str>,
    endpoint: Option<&str>,
) -> aws_config::SdkConfig {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .read_timeout(READ_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build();
    let conf = sdk_config(region, endpoint)
        .await
        .into_builder()
        .timeout_config(timeouts)
        .build();
    with_app_name(conf, OPERATOR_APP_NAME)
}

/// Text as tenants may read it (status conditions, Events): the ARNs of IAM principals (`arn:…:iam:…`
/// and `arn:…:sts:…`: users, roles, assumed-role sessions) become a placeholder. In an AccessDenied
/// answer the principal is the operator's own identity ("User: arn:aws:sts::…:assumed-role/… is not
/// authorized"), which one tenant has no business learning; resource ARNs (queues, alarms, topics)
/// are the tenant's own and stay.
pub fn without_principals(text: &str) -> std::borrow::Cow<'_, str> {
    const PLACEHOLDER: &str = "<the operator's AWS identity>";
    if !text.contains("arn:") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("arn:") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| {
                c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | ')' | '(' | '<' | '>')
            })
            .unwrap_or(tail.len());
        let arn = &tail[..end];
        // arn:PARTITION:SERVICE:REGION:ACCOUNT:RESOURCE
        let service = arn.split(':').nth(2).unwrap_or_default();
        if service == "iam" || service == "sts" {
            out.push_str(PLACEHOLDER);
        } else {
            out.push_str(arn);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    std::borrow::Cow::Owned(out)
}

/// [`without_principals`] of an owned text, which comes back as it was when there is nothing to hide.
pub fn scrub_principals(text: String) -> String {
    match without_principals(&text) {
        std::borrow::Cow::Owned(hidden) => hidden,
        std::borrow::Cow::Borrowed(_) => text,
    }
}

/// An error and its sources, joined with `: ` (the SDK's and our HTTP client's errors keep the
/// useful part, such as "invalid peer certificate", in a source).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::without_principals;

    #[test]
    fn the_app_names_are_valid_and_set() {
        for name in [super::WORKER_APP_NAME, super::OPERATOR_APP_NAME] {
            let conf = super::with_app_name(aws_config::SdkConfig::builder().build(), name);
            assert_eq!(
                conf.app_name().map(ToString::to_string),
                Some(name.to_string())
            );
        }
    }

    #[test]
    fn principal_arns_are_hidden_and_resource_arns_kept() {
        let denied = "AccessDenied: User: arn:aws:sts::111122223333:assumed-role/qc-operator/botocore-session-1 is not authorized to perform: sqs:getqueueattributes on resource: arn:aws:sqs:us-east-1:444455556666:orders because no resource-based policy allows the sqs:getqueueattributes action";
        let out = without_principals(denied);
        assert!(!out.contains("111122223333"), "{out}");
        assert!(!out.contains("qc-operator"), "{out}");
        assert!(
            out.contains("User: <the operator's AWS identity> is not authorized"),
            "{out}"
        );
        assert!(
            out.contains("arn:aws:sqs:us-east-1:444455556666:orders"),
            "{out}"
        );
        // Users and roles in other partitions, quoted or at the end of the text.
        let out = without_principals(
            "\"arn:aws-us-gov:iam::123456789012:user/ci\" and arn:aws-cn:iam::123456789012:role/x",
        );
        assert_eq!(
            out,
            "\"<the operator's AWS identity>\" and <the operator's AWS identity>"
        );
        // A resource ARN alone is kept (in a copy); text without "arn:" comes back as it is.
        assert!(matches!(
            without_principals("queue arn:aws:sqs:eu-west-1:1:q is gone"),
            std::borrow::Cow::Owned(_)
        ));
        assert!(matches!(
            without_principals("no ARN here"),
            std::borrow::Cow::Borrowed(_)
        ));
    }
}
