//! The worker's SQS calls: receive, batched delete and visibility changes, queue attributes.
//! Every call is counted by action, bounded by a timeout, and its errors classified for backoff and readiness.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider};
use aws_sdk_sqs::config::endpoint::{DefaultResolver, Params as EndpointParams, ResolveEndpoint};
use aws_types::service_config::ServiceConfigKey;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use hyper::Uri;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use super::http1::{Pool, Tls, connect_authority, default_port};
use super::metrics::Metrics;
use super::sigv4::Signer;
use crate::aws::error_chain;

/// The SQS actions the worker uses; metrics are labelled with these names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    ReceiveMessage,
    DeleteMessageBatch,
    ChangeMessageVisibility,
    ChangeMessageVisibilityBatch,
    GetQueueAttributes,
}

impl Action {
    pub const ALL: [Action; 5] = [
        Action::ReceiveMessage,
        Action::DeleteMessageBatch,
        Action::ChangeMessageVisibility,
        Action::ChangeMessageVisibilityBatch,
        Action::GetQueueAttributes,
    ];

    pub fn as_str(&self) -> &'static str {
        match self {
            Action::ReceiveMessage => "ReceiveMessage",
            Action::DeleteMessageBatch => "DeleteMessageBatch",
            Action::ChangeMessageVisibility => "ChangeMessageVisibility",
            Action::ChangeMessageVisibilityBatch => "ChangeMessageVisibilityBatch",
            Action::GetQueueAttributes => "GetQueueAttributes",
        }
    }

    pub fn index(&self) -> usize {
        *self as usize
    }

    /// The `X-Amz-Target` of the action.
    pub fn target(&self) -> &'static str {
        match self {
            Action::ReceiveMessage => "AmazonSQS.ReceiveMessage",
            Action::DeleteMessageBatch => "AmazonSQS.DeleteMessageBatch",
            Action::ChangeMessageVisibility => "AmazonSQS.ChangeMessageVisibility",
            Action::ChangeMessageVisibilityBatch => "AmazonSQS.ChangeMessageVisibilityBatch",
            Action::GetQueueAttributes => "AmazonSQS.GetQueueAttributes",
        }
    }
}

/// What kind of failure an SQS call had; decides between backing off and reporting not ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    QueueDoesNotExist,
    InvalidCredentials,
    AccessDenied,
    Throttled,
    ServerError,
    EndpointUnreachable,
    Timeout,
    InvalidReceiptHandle,
    InvalidParameter,
    Other,
}

impl ErrorKind {
    /// CamelCase reason, as in logs and the `reason` metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            ErrorKind::QueueDoesNotExist => "QueueDoesNotExist",
            ErrorKind::InvalidCredentials => "InvalidCredentials",
            ErrorKind::AccessDenied => "AccessDenied",
            ErrorKind::Throttled => "Throttled",
            ErrorKind::ServerError => "ServerError",
            ErrorKind::EndpointUnreachable => "EndpointUnreachable",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::InvalidReceiptHandle => "InvalidReceiptHandle",
            ErrorKind::InvalidParameter => "InvalidParameter",
            ErrorKind::Other => "AwsError",
        }
    }

    /// Misconfiguration that retrying will not fix: the worker reports not ready until it clears.
    pub fn is_configuration(&self) -> bool {
        matches!(
            self,
            ErrorKind::QueueDoesNotExist | ErrorKind::InvalidCredentials | ErrorKind::AccessDenied
        )
    }

    /// What an operator should do about it, for the log line.
    pub fn hint(&self) -> &'static str {
        match self {
            ErrorKind::QueueDoesNotExist => {
                "check --queue-url (and --region/--endpoint-url): the queue does not exist"
            }
            ErrorKind::InvalidCredentials => {
                "check the pod's AWS credentials (IRSA role, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            }
            ErrorKind::AccessDenied => {
                "grant sqs:ReceiveMessage, DeleteMessage, ChangeMessageVisibility and GetQueueAttributes on the queue"
            }
            ErrorKind::Throttled => "SQS is throttling: backing off",
            ErrorKind::ServerError => "SQS returned a server error: backing off",
            ErrorKind::EndpointUnreachable => "cannot reach the SQS endpoint: backing off",
            ErrorKind::Timeout => "the SQS call timed out: backing off",
            _ => "backing off",
        }
    }
}

/// One failed SQS call.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{action} failed ({reason}): {detail}", action = action.as_str(), reason = kind.reason())]
pub struct SqsError {
    pub action: Action,
    pub kind: ErrorKind,
    pub detail: String,
}

fn classify_code(code: &str) -> Option<ErrorKind> {
    Some(match code {
        "AWS.SimpleQueueService.NonExistentQueue" | "QueueDoesNotExist" => {
            ErrorKind::QueueDoesNotExist
        }
        "InvalidClientTokenId"
        | "SignatureDoesNotMatch"
        | "UnrecognizedClientException"
        | "ExpiredToken"
        | "InvalidSecurity"
        | "MissingAuthenticationToken"
        | "IncompleteSignature" => ErrorKind::InvalidCredentials,
        "AccessDenied" | "AccessDeniedException" | "KMS.AccessDeniedException" => {
            ErrorKind::AccessDenied
        }
        "Throttling"
        | "ThrottlingException"
        | "RequestThrottled"
        | "OverLimit"
        | "KMS.ThrottlingException" => ErrorKind::Throttled,
        "ReceiptHandleIsInvalid" | "InvalidReceiptHandle" | "MessageNotInflight" => {
            ErrorKind::InvalidReceiptHandle
        }
        "InvalidParameterValue" | "InvalidParameterValueException" => ErrorKind::InvalidParameter,
        "InternalError" | "InternalFailure" | "ServiceUnavailable" => ErrorKind::ServerError,
        _ => return None,
    })
}

/// A received message, with what the handlers and the idempotency key need.
#[derive(Clone, Debug)]
pub struct Message {
    pub id: String,
    pub receipt_handle: String,
    pub body: Bytes,
    pub receive_count: u32,
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
    pub sequence_number: Option<String>,
    /// Milliseconds since the epoch.
    pub sent_timestamp: Option<u64>,
    pub attributes: Vec<(String, AttributeValue)>,
    /// When the receive call returned: the lease started no later than this.
    pub received_at: Instant,
}

/// A message attribute: string and number types carry `string`, binary ones `binary`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttributeValue {
    pub data_type: String,
    pub string: Option<String>,
    pub binary: Option<Vec<u8>>,
}

impl Message {
    pub fn attribute(&self, name: &str) -> Option<&AttributeValue> {
        self.attributes
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v)
    }

    fn from_wire(m: WireMessage, received_at: Instant) -> Option<Message> {
        let id = m.message_id?;
        let receipt_handle = m.receipt_handle?;
        let sys = m.attributes.unwrap_or_default();
        let mut attributes: Vec<(String, AttributeValue)> = m
            .message_attributes
            .unwrap_or_default()
            .into_iter()
            .map(|(name, v)| {
                let binary = v.binary_value.and_then(|b| match BASE64.decode(b.as_bytes()) {
                    Ok(bytes) => Some(bytes),
                    Err(e) => {
                        // Keep the message: a handler without this attribute beats losing it.
                        tracing::warn!(message_id = %id, attribute = %name, error = %e, "binary attribute is not base64; passed on without it");
                        None
                    }
                });
                let value = AttributeValue {
                    data_type: v.data_type,
                    string: v.string_value,
                    binary,
                };
                (name, value)
            })
            .collect();
        attributes.sort_by(|a, b| a.0.cmp(&b.0));
        Some(Message {
            receive_count: sys
                .approximate_receive_count
                .and_then(|c| c.parse().ok())
                .unwrap_or(1),
            group_id: sys.message_group_id,
            deduplication_id: sys.message_deduplication_id,
            sequence_number: sys.sequence_number,
            sent_timestamp: sys.sent_timestamp.and_then(|t| t.parse().ok()),
            id,
            receipt_handle,
            body: Bytes::from(m.body.unwrap_or_default().into_bytes()),
            attributes,
            received_at,
        })
    }
}

/// One entry of a batched delete or visibility change.
#[derive(Clone, Debug)]
pub struct Entry {
    pub message_id: String,
    pub receipt_handle: String,
}

/// Per-entry failure of a batch call.
#[derive(Clone, Debug)]
pub struct EntryFailure {
    pub index: usize,
    pub code: String,
    pub sender_fault: bool,
    pub message: String,
}

/// What the worker needs from a queue at start.
#[derive(Clone, Debug)]
pub struct QueueInfo {
    pub visibility_timeout: Duration,
    pub arn: String,
    pub fifo: bool,
    pub max_receive_count: Option<u32>,
}

/// A lean SQS client bound to one queue: the AWS JSON 1.0 protocol over pooled HTTP/1.1 connections
/// (TLS for https endpoints), signed with SigV4; each request is counted by action.
#[derive(Clone)]
pub struct Sqs {
    inner: Arc<Inner>,
    metrics: Arc<Metrics>,
}

struct Inner {
    pool: Pool,
    endpoint: Uri,
    /// `POST <path> HTTP/1.1` and the Host header, the same for every request.
    request_line: Vec<u8>,
    /// The Host header, as signed (no default port).
    host: String,
    signer: Signer,
    url: String,
    credentials: CredentialsCache,
}

/// Bound on calls other than the long poll: there are no hidden retries, so a hung connection must not block.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Idle connections are closed after this; shorter than the usual server-side idle limits.
const POOL_IDLE: Duration = Duration::from_secs(30);
/// Idle connections kept at most (receives, batch flushes and heartbeats run in parallel).
const POOL_MAX_IDLE: usize = 256;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const SIGNING_NAME: &str = "sqs";
const CONTENT_TYPE_JSON: &str = "application/x-amz-json-1.0";

impl Sqs {
    /// Binds to `url`, with the endpoint, region and credentials of `sdk` resolved as the SDK's SQS
    /// client would: `--endpoint-url`, `AWS_ENDPOINT_URL_SQS`/`AWS_ENDPOINT_URL` or the profile's
    /// `endpoint_url`, else the regional endpoint (FIPS and dual-stack honoured).
    pub async fn new(
        sdk: &aws_types::SdkConfig,
        url: &str,
        metrics: Arc<Metrics>,
    ) -> Result<Self, String> {
        let region = sdk
            .region()
            .map(|r| r.as_ref().to_string())
            .ok_or("no AWS region: pass --region, use an SQS queue URL, or set AWS_REGION")?;
        let override_url = if sdk.get_origin("endpoint_url").is_client_config() {
            sdk.endpoint_url().map(str::to_string)
        } else {
            sdk.service_config()
                .and_then(|c| {
                    c.load_config(
                        ServiceConfigKey::builder()
                            .service_id("SQS")
                            .env("AWS_ENDPOINT_URL")
                            .profile("endpoint_url")
                            .build()
                            .ok()?,
                    )
                })
                .or_else(|| sdk.endpoint_url().map(str::to_string))
        };
        let params = EndpointParams::builder()
            .region(region.clone())
            .set_use_fips(sdk.use_fips())
            .set_use_dual_stack(sdk.use_dual_stack())
            .set_endpoint(override_url)
            .build()
            .map_err(|e| format!("invalid SQS endpoint parameters: {e}"))?;
        let endpoint = DefaultResolver::new()
            .resolve_endpoint(&params)
            .await
            .map_err(|e| format!("cannot resolve the SQS endpoint: {e}"))?;
        let endpoint: Uri = endpoint
            .url()
            .parse()
            .map_err(|e| format!("SQS endpoint {:?} is not a URL: {e}", endpoint.url()))?;
        let host =
            host_header(&endpoint).ok_or_else(|| format!("SQS endpoint {endpoint} has no host"))?;
        let provider = sdk
            .credentials_provider()
            .ok_or("no AWS credentials provider configured")?;

        let tls = match endpoint.scheme_str() {
            Some("https") => Some(tls_for(&endpoint)?),
            Some("http") => None,
            other => {
                return Err(format!(
                    "SQS endpoint {endpoint} has scheme {other:?}; use https:// (or http:// for a local emulator)"
                ));
            }
        };
        let authority = connect_authority(&endpoint)
            .ok_or_else(|| format!("SQS endpoint {endpoint} has no host"))?;
        let mut request_line = Vec::with_capacity(64);
        let path = match endpoint.path() {
            "" => "/",
            p => p,
        };
        request_line
            .extend_from_slice(format!("POST {path} HTTP/1.1\r\nhost: {host}\r\n").as_bytes());
        Ok(Sqs {
            inner: Arc::new(Inner {
                pool: Pool::new(authority, tls, POOL_MAX_IDLE, POOL_IDLE, CONNECT_TIMEOUT),
                signer: Signer::new(&region, SIGNING_NAME, path),
                endpoint,
                request_line,
                host,
                url: url.to_string(),
                credentials: CredentialsCache::new(provider),
            }),
            metrics,
        })
    }

    pub fn url(&self) -> &str {
        &self.inner.url
    }

    /// Counts, bounds and logs one call; Ok carries the answer's body.
    async fn call(
        &self,
        action: Action,
        timeout: Duration,
        body: Vec<u8>,
    ) -> Result<Bytes, SqsError> {
        self.metrics.sqs_requests[action.index()].inc();
        // Boxed: the call's state (HTTP exchange, TLS) would otherwise sit inside every message
        // task's future, which is copied whole when the task is spawned.
        let result = match tokio::time::timeout(timeout, Box::pin(self.send(action, body))).await {
            Ok(r) => r,
            Err(_) => Err(SqsError {
                action,
                kind: ErrorKind::Timeout,
                detail: format!("no answer within {}s", timeout.as_secs()),
            }),
        };
        if let Err(e) = &result {
            self.metrics.sqs_errors[action.index()].inc();
            tracing::debug!(action = action.as_str(), reason = e.kind.reason(), error = %e.detail, "sqs call failed");
        }
        result
    }

    async fn send(&self, action: Action, body: Vec<u8>) -> Result<Bytes, SqsError> {
        let fail = |kind, detail: String| SqsError {
            action,
            kind,
            detail,
        };
        let inner = &*self.inner;
        let creds = inner
            .credentials
            .get()
            .await
            .map_err(|(kind, detail)| fail(kind, detail))?;
        let head = request_head(
            &inner.request_line,
            &inner.host,
            &inner.signer,
            &creds,
            action,
            &body,
            SystemTime::now(),
        )
        .map_err(|detail| fail(ErrorKind::InvalidCredentials, detail))?;
        let answer = inner.pool.send(&head, &body, true).await.map_err(|e| {
            fail(
                ErrorKind::EndpointUnreachable,
                format!("{}: {}", inner.endpoint, error_chain(&e)),
            )
        })?;
        if (200..300).contains(&answer.status) {
            Ok(Bytes::from(answer.body))
        } else {
            let (kind, detail) =
                service_error(answer.status, answer.query_error.as_deref(), &answer.body);
            Err(fail(kind, detail))
        }
    }

    pub async fn queue_info(&self) -> Result<QueueInfo, SqsError> {
        let action = Action::GetQueueAttributes;
        let body = encode(&GetQueueAttributesInput {
            queue_url: self.url(),
            attribute_names: &["All"],
        });
        let out: GetQueueAttributesOutput =
            decode(action, &self.call(action, CALL_TIMEOUT, body).await?)?;
        parse_queue_info(&out.attributes.unwrap_or_default()).map_err(|detail| SqsError {
            action,
            kind: ErrorKind::Other,
            detail,
        })
    }

    pub async fn receive(&self, max: u32, wait: Duration) -> Result<Vec<Message>, SqsError> {
        let action = Action::ReceiveMessage;
        let body = receive_body(self.url(), max, wait);
        let answer = self.call(action, wait + CALL_TIMEOUT, body).await?;
        let out: ReceiveMessageOutput = decode(action, &answer)?;
        let now = Instant::now();
        let mut messages = Vec::new();
        for m in out.messages.unwrap_or_default() {
            match Message::from_wire(m, now) {
                Some(msg) => messages.push(msg),
                None => tracing::warn!("received a message without id or receipt handle; ignored"),
            }
        }
        Ok(messages)
    }

    /// DeleteMessageBatch (≤ 10 entries); Ok carries the entries that failed.
    pub async fn delete_batch(&self, entries: &[Entry]) -> Result<Vec<EntryFailure>, SqsError> {
        self.batch(Action::DeleteMessageBatch, entries, None).await
    }

    /// ChangeMessageVisibilityBatch (≤ 10 entries) to `secs`; Ok carries the entries that failed.
    pub async fn change_visibility_batch(
        &self,
        entries: &[Entry],
        secs: i32,
    ) -> Result<Vec<EntryFailure>, SqsError> {
        self.batch(Action::ChangeMessageVisibilityBatch, entries, Some(secs))
            .await
    }

    /// One batch call; the two batch actions differ only in the visibility each entry carries.
    async fn batch(
        &self,
        action: Action,
        entries: &[Entry],
        visibility: Option<i32>,
    ) -> Result<Vec<EntryFailure>, SqsError> {
        let body = batch_body(self.url(), entries, visibility);
        let out: BatchOutput = decode(action, &self.call(action, CALL_TIMEOUT, body).await?)?;
        Ok(batch_failures(
            out.failed.unwrap_or_default(),
            entries.len(),
        ))
    }

    pub async fn change_visibility(&self, receipt_handle: &str, secs: i32) -> Result<(), SqsError> {
        let action = Action::ChangeMessageVisibility;
        let body = encode(&ChangeMessageVisibilityInput {
            queue_url: self.url(),
            receipt_handle,
            visibility_timeout: secs,
        });
        self.call(action, CALL_TIMEOUT, body).await.map(|_| ())
    }
}

/// The Host header the signature covers and the request carries: the host, with the port unless
/// it is the scheme's default.
fn host_header(uri: &Uri) -> Option<String> {
    let host = uri.host()?;
    Some(match uri.port_u16() {
        Some(p) if p != default_port(uri) => format!("{host}:{p}"),
        _ => host.to_string(),
    })
}

/// TLS to the endpoint's host: rustls with aws-lc (the stack the SDK already brings) and the
/// system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured), HTTP/1.1 by ALPN.
fn tls_for(endpoint: &Uri) -> Result<Tls, String> {
    let host = endpoint
        .host()
        .ok_or_else(|| format!("SQS endpoint {endpoint} has no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let server_name = ServerName::try_from(bare.to_string())
        .map_err(|e| format!("SQS endpoint host {host:?} cannot be checked by TLS: {e}"))?;
    let loaded = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(loaded.certs);
    if added == 0 {
        let why = loaded
            .errors
            .first()
            .map_or_else(|| "none found".to_string(), |e| e.to_string());
        return Err(format!(
            "cannot load TLS root certificates ({why}): install a CA bundle or set SSL_CERT_FILE"
        ));
    }
    let provider = Arc::new(tokio_rustls::rustls::crypto::aws_lc_rs::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS configuration: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Tls {
        connector: TlsConnector::from(Arc::new(config)),
        server_name,
    })
}

/// The request head for `action`, signed with SigV4 (content type, host, target, date and any
/// session token are signed); the body follows it.
fn request_head(
    request_line: &[u8],
    host: &str,
    signer: &Signer,
    creds: &Credentials,
    action: Action,
    body: &[u8],
    now: SystemTime,
) -> Result<Vec<u8>, String> {
    let token = creds.session_token();
    // Credentials go into headers: a control character would end the header early.
    let clean = |s: &str| s.bytes().all(|b| (0x21..0x7f).contains(&b));
    if !clean(creds.access_key_id()) || !token.is_none_or(clean) {
        return Err(
            "the AWS access key id or session token holds spaces or control characters; check the credentials' source"
                .into(),
        );
    }
    let target = action.target();
    let signed = signer.sign(
        creds.access_key_id(),
        creds.secret_access_key(),
        token,
        &[
            ("content-type", CONTENT_TYPE_JSON),
            ("host", host),
            ("x-amz-target", target),
        ],
        body,
        now,
    )?;
    let mut head = Vec::with_capacity(request_line.len() + 320 + token.map_or(0, str::len));
    head.extend_from_slice(request_line);
    for (name, value) in [
        ("content-type", CONTENT_TYPE_JSON),
        ("x-amz-target", target),
        ("x-amz-date", signed.amz_date.as_str()),
    ]
    .into_iter()
    .chain(token.map(|t| ("x-amz-security-token", t)))
    .chain([("authorization", signed.authorization.as_str())])
    {
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    Ok(head)
}

/// Credentials from the SDK's provider chain (env, profile, web identity, ECS, IMDS), kept until
/// shortly before they expire so a request does not cost a provider call.
struct CredentialsCache {
    provider: SharedCredentialsProvider,
    cached: std::sync::Mutex<Option<(Credentials, Instant)>>,
    refresh: tokio::sync::Mutex<()>,
}

/// Refresh this long before the credentials expire.
const CREDENTIALS_BUFFER: Duration = Duration::from_secs(300);
/// Credentials without an expiry are asked for again after this.
const CREDENTIALS_DEFAULT_TTL: Duration = Duration::from_secs(900);

impl CredentialsCache {
    fn new(provider: SharedCredentialsProvider) -> Self {
        CredentialsCache {
            provider,
            cached: std::sync::Mutex::new(None),
            refresh: tokio::sync::Mutex::new(()),
        }
    }

    fn current(&self) -> Option<Credentials> {
        let guard = self.cached.lock().ok()?;
        let (creds, until) = guard.as_ref()?;
        (Instant::now() < *until).then(|| creds.clone())
    }

    async fn get(&self) -> Result<Credentials, (ErrorKind, String)> {
        if let Some(c) = self.current() {
            return Ok(c);
        }
        // One refresh at a time; the others then find it cached.
        let _refreshing = self.refresh.lock().await;
        if let Some(c) = self.current() {
            return Ok(c);
        }
        let creds = self.provider.provide_credentials().await.map_err(|e| {
            let kind = match e {
                CredentialsError::ProviderTimedOut(_) => ErrorKind::Timeout,
                _ => ErrorKind::InvalidCredentials,
            };
            (kind, format!("loading credentials: {}", error_chain(&e)))
        })?;
        let until = cache_until(creds.expiry(), SystemTime::now(), Instant::now());
        if let Ok(mut guard) = self.cached.lock() {
            *guard = Some((creds.clone(), until));
        }
        Ok(creds)
    }
}

/// Until when credentials expiring at `expiry` are reused: `CREDENTIALS_BUFFER` before the expiry,
/// but at least a few seconds (credentials about to expire are still better than a provider call per request).
fn cache_until(expiry: Option<SystemTime>, now: SystemTime, now_instant: Instant) -> Instant {
    let Some(expiry) = expiry else {
        return now_instant + CREDENTIALS_DEFAULT_TTL;
    };
    let left = expiry.duration_since(now).unwrap_or(Duration::ZERO);
    let keep = left
        .saturating_sub(CREDENTIALS_BUFFER)
        .max(left.min(Duration::from_secs(5)));
    now_instant + keep
}

/// Classifies a non-2xx answer: the awsQuery-compatible code header first (what SQS sends), then the
/// JSON `__type`/`code`, then the status.
fn service_error(status: u16, query_error: Option<&str>, body: &[u8]) -> (ErrorKind, String) {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let field = |names: &[&str]| -> Option<String> {
        let obj = parsed.as_ref()?.as_object()?;
        names
            .iter()
            .find_map(|n| obj.get(*n)?.as_str().map(str::to_string))
    };
    let code = query_error
        .and_then(|h| h.split(';').next())
        .map(str::to_string)
        .filter(|c| !c.is_empty())
        .or_else(|| field(&["__type", "code", "Code"]).map(|t| sanitize_code(&t).to_string()));
    let message = field(&["message", "Message"]);
    let kind = match code.as_deref().and_then(classify_code) {
        Some(kind) => kind,
        None if status == 403 => ErrorKind::AccessDenied,
        None if status == 429 => ErrorKind::Throttled,
        None if status >= 500 => ErrorKind::ServerError,
        None => ErrorKind::Other,
    };
    let detail = match (code, message) {
        (Some(c), Some(m)) => format!("{c}: {m} (HTTP {status})"),
        (Some(c), None) => format!("{c} (HTTP {status})"),
        (None, _) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            format!("HTTP {status}: {text:?}")
        }
    };
    (kind, detail)
}

/// `com.amazonaws.sqs#QueueDoesNotExist:http://...` → `QueueDoesNotExist`.
fn sanitize_code(t: &str) -> &str {
    let t = t.rsplit_once('#').map_or(t, |(_, c)| c);
    t.split_once(':').map_or(t, |(c, _)| c)
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    // Serializing these structs of strings and numbers cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}

fn decode<T: DeserializeOwned>(action: Action, body: &[u8]) -> Result<T, SqsError> {
    // An empty 200 body is an empty answer.
    let body = if body.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| SqsError {
        action,
        kind: ErrorKind::Other,
        detail: format!("malformed answer: {e}"),
    })
}

/// Only the system attributes the worker uses: less to send and to parse than All.
const SYSTEM_ATTRIBUTES: [&str; 5] = [
    "ApproximateReceiveCount",
    "SentTimestamp",
    "MessageGroupId",
    "MessageDeduplicationId",
    "SequenceNumber",
];

fn receive_body(url: &str, max: u32, wait: Duration) -> Vec<u8> {
    encode(&ReceiveMessageInput {
        queue_url: url,
        max_number_of_messages: max.clamp(1, 10),
        wait_time_seconds: wait.as_secs().min(20),
        message_system_attribute_names: &SYSTEM_ATTRIBUTES,
        message_attribute_names: &["All"],
    })
}

fn batch_body(url: &str, entries: &[Entry], visibility: Option<i32>) -> Vec<u8> {
    let entries: Vec<BatchEntry<'_>> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| BatchEntry {
            id: i.to_string(),
            receipt_handle: &e.receipt_handle,
            visibility_timeout: visibility,
        })
        .collect();
    encode(&BatchInput {
        queue_url: url,
        entries,
    })
}

fn batch_failures(failed: Vec<WireFailure>, len: usize) -> Vec<EntryFailure> {
    failed
        .into_iter()
        .filter_map(|f| {
            let index: usize = f.id.parse().ok()?;
            (index < len).then(|| EntryFailure {
                index,
                code: f.code.unwrap_or_default(),
                sender_fault: f.sender_fault.unwrap_or(false),
                message: f.message.unwrap_or_default(),
            })
        })
        .collect()
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct GetQueueAttributesInput<'a> {
    queue_url: &'a str,
    attribute_names: &'a [&'a str],
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct GetQueueAttributesOutput {
    attributes: Option<HashMap<String, String>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ReceiveMessageInput<'a> {
    queue_url: &'a str,
    max_number_of_messages: u32,
    wait_time_seconds: u64,
    message_system_attribute_names: &'a [&'a str],
    message_attribute_names: &'a [&'a str],
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ReceiveMessageOutput {
    messages: Option<Vec<WireMessage>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireMessage {
    message_id: Option<String>,
    receipt_handle: Option<String>,
    body: Option<String>,
    attributes: Option<SystemAttributes>,
    message_attributes: Option<HashMap<String, WireAttribute>>,
}

/// The system attributes the worker asks for (SYSTEM_ATTRIBUTES), as fields: no map per message.
#[derive(Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct SystemAttributes {
    approximate_receive_count: Option<String>,
    sent_timestamp: Option<String>,
    message_group_id: Option<String>,
    message_deduplication_id: Option<String>,
    sequence_number: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireAttribute {
    data_type: String,
    string_value: Option<String>,
    /// Base64 in the JSON protocol.
    binary_value: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct BatchInput<'a> {
    queue_url: &'a str,
    entries: Vec<BatchEntry<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct BatchEntry<'a> {
    id: String,
    receipt_handle: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    visibility_timeout: Option<i32>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BatchOutput {
    failed: Option<Vec<WireFailure>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct WireFailure {
    id: String,
    sender_fault: Option<bool>,
    code: Option<String>,
    message: Option<String>,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ChangeMessageVisibilityInput<'a> {
    queue_url: &'a str,
    receipt_handle: &'a str,
    visibility_timeout: i32,
}

/// Reads what the worker needs from GetQueueAttributes(All).
pub fn parse_queue_info(attrs: &HashMap<String, String>) -> Result<QueueInfo, String> {
    let vt = attrs
        .get("VisibilityTimeout")
        .ok_or("GetQueueAttributes returned no VisibilityTimeout")?;
    let vt: u64 = vt
        .parse()
        .map_err(|_| format!("VisibilityTimeout {vt:?} is not a whole number of seconds"))?;
    let max_receive_count = attrs.get("RedrivePolicy").and_then(|p| {
        let v: serde_json::Value = serde_json::from_str(p).ok()?;
        match v.get("maxReceiveCount")? {
            serde_json::Value::Number(n) => n.as_u64().and_then(|n| u32::try_from(n).ok()),
            serde_json::Value::String(s) => s.parse().ok(),
            _ => None,
        }
    });
    Ok(QueueInfo {
        visibility_timeout: Duration::from_secs(vt),
        arn: attrs.get("QueueArn").cloned().unwrap_or_default(),
        fifo: attrs.get("FifoQueue").is_some_and(|v| v == "true"),
        max_receive_count,
    })
}

/// The region in an SQS URL (`https://sqs.eu-west-1.amazonaws.com/...` or the legacy
/// `https://eu-west-1.queue.amazonaws.com/...`); None for other hosts such as local emulators.
pub fn region_from_url(url: &str) -> Option<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let host = rest.split(['/', ':']).next()?;
    let labels: Vec<&str> = host.split('.').collect();
    match labels.as_slice() {
        ["sqs", region, "amazonaws", ..] => Some((*region).to_string()),
        [region, "queue", "amazonaws", ..] => Some((*region).to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_comes_from_aws_hosts_only() {
        assert_eq!(
            region_from_url("https://sqs.eu-west-1.amazonaws.com/1/q").as_deref(),
            Some("eu-west-1")
        );
        assert_eq!(
            region_from_url("https://us-east-2.queue.amazonaws.com/1/q").as_deref(),
            Some("us-east-2")
        );
        assert_eq!(
            region_from_url("https://sqs.cn-north-1.amazonaws.com.cn/1/q").as_deref(),
            Some("cn-north-1")
        );
        assert_eq!(region_from_url("http://127.0.0.1:4566/000/q"), None);
    }

    #[test]
    fn queue_info_reads_vt_fifo_and_redrive() {
        let attrs: HashMap<String, String> = [
            ("VisibilityTimeout", "45"),
            ("QueueArn", "arn:aws:sqs:us-east-1:1:q.fifo"),
            ("FifoQueue", "true"),
            (
                "RedrivePolicy",
                r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:1:d.fifo","maxReceiveCount":"4"}"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let info = parse_queue_info(&attrs).unwrap();
        assert_eq!(info.visibility_timeout, Duration::from_secs(45));
        assert!(info.fifo);
        assert_eq!(info.max_receive_count, Some(4));
        let bad: HashMap<String, String> =
            [("VisibilityTimeout".to_string(), "x".to_string())].into();
        assert!(
            parse_queue_info(&bad)
                .unwrap_err()
                .contains("VisibilityTimeout")
        );
    }

    #[test]
    fn error_codes_map_to_kinds() {
        assert_eq!(
            classify_code("AWS.SimpleQueueService.NonExistentQueue"),
            Some(ErrorKind::QueueDoesNotExist)
        );
        assert_eq!(
            classify_code("InvalidClientTokenId"),
            Some(ErrorKind::InvalidCredentials)
        );
        assert_eq!(
            classify_code("RequestThrottled"),
            Some(ErrorKind::Throttled)
        );
        assert!(ErrorKind::AccessDenied.is_configuration());
        assert!(!ErrorKind::Throttled.is_configuration());
        assert_eq!(classify_code("SomethingNew"), None);
    }

    fn json(bytes: &[u8]) -> serde_json::Value {
        serde_json::from_slice(bytes).unwrap()
    }

    #[test]
    fn receive_body_asks_only_for_what_the_worker_uses() {
        let v = json(&receive_body("http://q/1/a", 25, Duration::from_secs(30)));
        assert_eq!(
            v,
            serde_json::json!({
                "QueueUrl": "http://q/1/a",
                "MaxNumberOfMessages": 10,
                "WaitTimeSeconds": 20,
                "MessageSystemAttributeNames": ["ApproximateReceiveCount", "SentTimestamp", "MessageGroupId", "MessageDeduplicationId", "SequenceNumber"],
                "MessageAttributeNames": ["All"],
            })
        );
        let v = json(&receive_body("u", 0, Duration::ZERO));
        assert_eq!(v["MaxNumberOfMessages"], 1);
        assert_eq!(v["WaitTimeSeconds"], 0);
    }

    #[test]
    fn batch_bodies_number_entries_and_carry_visibility_only_for_releases() {
        let entries = vec![
            Entry {
                message_id: "m1".into(),
                receipt_handle: "rh-1".into(),
            },
            Entry {
                message_id: "m2".into(),
                receipt_handle: "rh-\"2\"".into(),
            },
        ];
        assert_eq!(
            json(&batch_body("u", &entries, None)),
            serde_json::json!({"QueueUrl": "u", "Entries": [
                {"Id": "0", "ReceiptHandle": "rh-1"},
                {"Id": "1", "ReceiptHandle": "rh-\"2\""},
            ]})
        );
        assert_eq!(
            json(&batch_body("u", &entries, Some(0)))["Entries"][1],
            serde_json::json!({"Id": "1", "ReceiptHandle": "rh-\"2\"", "VisibilityTimeout": 0})
        );
    }

    #[test]
    fn received_messages_keep_attributes_and_bytes() {
        let answer = br#"{"Messages":[
            {"MessageId":"id-1","ReceiptHandle":"rh","MD5OfBody":"x","Body":"{\"a\":1} \u00e9",
             "Attributes":{"ApproximateReceiveCount":"3","SentTimestamp":"1700000000123","MessageGroupId":"g","SequenceNumber":"7"},
             "MessageAttributes":{"z":{"DataType":"String","StringValue":"last"},"bin":{"DataType":"Binary","BinaryValue":"AAEC"},"bad":{"DataType":"Binary","BinaryValue":"%%"}}},
            {"ReceiptHandle":"no-id"}
        ]}"#;
        let out: ReceiveMessageOutput = decode(Action::ReceiveMessage, answer).unwrap();
        let now = Instant::now();
        let msgs: Vec<Message> = out
            .messages
            .unwrap()
            .into_iter()
            .filter_map(|m| Message::from_wire(m, now))
            .collect();
        assert_eq!(msgs.len(), 1, "a message without id is ignored");
        let m = &msgs[0];
        assert_eq!(m.id, "id-1");
        assert_eq!(m.receipt_handle, "rh");
        assert_eq!(&m.body[..], "{\"a\":1} é".as_bytes());
        assert_eq!(m.receive_count, 3);
        assert_eq!(m.sent_timestamp, Some(1_700_000_000_123));
        assert_eq!(m.group_id.as_deref(), Some("g"));
        assert_eq!(m.sequence_number.as_deref(), Some("7"));
        assert_eq!(m.deduplication_id, None);
        let names: Vec<&str> = m.attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["bad", "bin", "z"]);
        assert_eq!(
            m.attribute("bin").unwrap().binary.as_deref(),
            Some(&[0u8, 1, 2][..])
        );
        assert_eq!(m.attribute("bad").unwrap().binary, None);
        assert_eq!(m.attribute("z").unwrap().string.as_deref(), Some("last"));

        let empty: ReceiveMessageOutput = decode(Action::ReceiveMessage, b"{}").unwrap();
        assert!(empty.messages.is_none());
    }

    #[test]
    fn malformed_answers_are_classified_errors() {
        for body in [
            &b"<xml/>"[..],
            b"{\"Messages\":5}",
            b"{\"Messages\":[{\"MessageId\":1}]}",
            b"\xff",
        ] {
            let e = decode::<ReceiveMessageOutput>(Action::ReceiveMessage, body)
                .err()
                .unwrap();
            assert_eq!(e.kind, ErrorKind::Other);
            assert!(e.detail.starts_with("malformed answer"), "{}", e.detail);
        }
        let out: BatchOutput = decode(Action::DeleteMessageBatch, b"").unwrap();
        assert!(out.failed.is_none());
        let out: GetQueueAttributesOutput = decode(Action::GetQueueAttributes, b"{}").unwrap();
        assert!(parse_queue_info(&out.attributes.unwrap_or_default()).is_err());
    }

    #[test]
    fn batch_failures_keep_known_entries_only() {
        let out: BatchOutput = decode(
            Action::DeleteMessageBatch,
            br#"{"Successful":[{"Id":"0"}],"Failed":[
                {"Id":"1","SenderFault":true,"Code":"ReceiptHandleIsInvalid","Message":"bad"},
                {"Id":"2","Code":"InternalError"},
                {"Id":"9","SenderFault":false,"Code":"X"},
                {"Id":"x","Code":"Y"}]}"#,
        )
        .unwrap();
        let f = batch_failures(out.failed.unwrap(), 3);
        assert_eq!(f.len(), 2);
        assert_eq!(
            (f[0].index, f[0].sender_fault, f[0].code.as_str()),
            (1, true, "ReceiptHandleIsInvalid")
        );
        assert_eq!(f[0].message, "bad");
        assert_eq!(
            (f[1].index, f[1].sender_fault, f[1].message.as_str()),
            (2, false, "")
        );
    }

    #[test]
    fn service_errors_map_like_the_sdk() {
        let (kind, detail) = service_error(
            400,
            Some("AWS.SimpleQueueService.NonExistentQueue;Sender"),
            br#"{"__type":"com.amazonaws.sqs#QueueDoesNotExist","message":"The specified queue does not exist."}"#,
        );
        assert_eq!(kind, ErrorKind::QueueDoesNotExist);
        assert!(
            detail.contains("The specified queue does not exist"),
            "{detail}"
        );
        let (kind, _) = service_error(
            400,
            None,
            br#"{"__type":"com.amazon.coral.service#UnrecognizedClientException","message":"bad token"}"#,
        );
        assert_eq!(kind, ErrorKind::InvalidCredentials);
        let (kind, _) = service_error(400, None, br#"{"__type":"QueueDoesNotExist:http://x"}"#);
        assert_eq!(kind, ErrorKind::QueueDoesNotExist);
        let (kind, _) = service_error(400, None, br#"{"code":"ThrottlingException"}"#);
        assert_eq!(kind, ErrorKind::Throttled);
        assert_eq!(service_error(403, None, b"").0, ErrorKind::AccessDenied);
        assert_eq!(service_error(429, None, b"nope").0, ErrorKind::Throttled);
        let (kind, detail) = service_error(503, None, b"<html>busy</html>");
        assert_eq!(kind, ErrorKind::ServerError);
        assert!(
            detail.contains("503") && detail.contains("busy"),
            "{detail}"
        );
        assert_eq!(
            service_error(400, None, br#"{"__type":"Novel"}"#).0,
            ErrorKind::Other
        );
        assert_eq!(service_error(400, Some(";"), b"[1]").0, ErrorKind::Other);
    }

    #[test]
    fn host_header_drops_default_ports() {
        let h = |u: &str| host_header(&u.parse().unwrap()).unwrap();
        assert_eq!(
            h("https://sqs.eu-west-1.amazonaws.com"),
            "sqs.eu-west-1.amazonaws.com"
        );
        assert_eq!(
            h("https://sqs.eu-west-1.amazonaws.com:443/"),
            "sqs.eu-west-1.amazonaws.com"
        );
        assert_eq!(h("http://127.0.0.1:4566"), "127.0.0.1:4566");
        assert_eq!(h("http://localhost:80"), "localhost");
        assert!(host_header(&"/just/a/path".parse().unwrap()).is_none());
    }

    #[test]
    fn credentials_are_reused_until_shortly_before_expiry() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let at = Instant::now();
        assert_eq!(cache_until(None, now, at), at + CREDENTIALS_DEFAULT_TTL);
        let hour = now + Duration::from_secs(3600);
        assert_eq!(
            cache_until(Some(hour), now, at),
            at + Duration::from_secs(3300)
        );
        // Nearly expired: reused for a few seconds rather than fetched per request.
        let soon = now + Duration::from_secs(60);
        assert_eq!(
            cache_until(Some(soon), now, at),
            at + Duration::from_secs(5)
        );
        assert_eq!(cache_until(Some(now - Duration::from_secs(1)), now, at), at);
    }

    /// SigV4 computed here step by step, independently of aws-sigv4: the request's signature must match.
    #[test]
    fn requests_are_signed_over_target_host_and_body() {
        use hmac::{Hmac, KeyInit, Mac};
        use sha2::{Digest, Sha256};
        fn hmac(key: &[u8], data: &str) -> Vec<u8> {
            let mut m = Hmac::<Sha256>::new_from_slice(key).unwrap();
            m.update(data.as_bytes());
            m.finalize().into_bytes().to_vec()
        }
        /// The head's headers by name, the request line checked.
        fn headers(head: &[u8]) -> HashMap<String, String> {
            let mut parsed = [httparse::EMPTY_HEADER; 16];
            let mut req = httparse::Request::new(&mut parsed);
            assert_eq!(
                req.parse(head).unwrap(),
                httparse::Status::Complete(head.len())
            );
            assert_eq!(
                (req.method, req.path, req.version),
                (Some("POST"), Some("/"), Some(1))
            );
            req.headers
                .iter()
                .map(|h| {
                    (
                        h.name.to_string(),
                        String::from_utf8(h.value.to_vec()).unwrap(),
                    )
                })
                .collect()
        }
        let endpoint: Uri = "https://sqs.eu-west-1.amazonaws.com".parse().unwrap();
        let host = host_header(&endpoint).unwrap();
        let line = format!("POST / HTTP/1.1\r\nhost: {host}\r\n");
        let signer = Signer::new("eu-west-1", SIGNING_NAME, "/");
        let creds = Credentials::new("AKIDEXAMPLE", "secret/key", None, None, "test");
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000); // 2023-11-14T22:13:20Z
        let body = br#"{"QueueUrl":"u","Entries":[]}"#.to_vec();
        let head = request_head(
            line.as_bytes(),
            &host,
            &signer,
            &creds,
            Action::DeleteMessageBatch,
            &body,
            now,
        )
        .unwrap();
        let h = headers(&head);
        assert_eq!(h["x-amz-target"], "AmazonSQS.DeleteMessageBatch");
        assert_eq!(h["content-type"], "application/x-amz-json-1.0");
        assert_eq!(h["host"], "sqs.eu-west-1.amazonaws.com");
        assert_eq!(h["x-amz-date"], "20231114T221320Z");
        assert_eq!(h["content-length"], body.len().to_string());
        assert!(!h.contains_key("x-amz-security-token"));

        let canonical = format!(
            "POST\n/\n\ncontent-type:application/x-amz-json-1.0\nhost:sqs.eu-west-1.amazonaws.com\nx-amz-date:20231114T221320Z\nx-amz-target:AmazonSQS.DeleteMessageBatch\n\ncontent-type;host;x-amz-date;x-amz-target\n{}",
            hex::encode(Sha256::digest(&body))
        );
        let scope = "20231114/eu-west-1/sqs/aws4_request";
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n20231114T221320Z\n{scope}\n{}",
            hex::encode(Sha256::digest(canonical.as_bytes()))
        );
        let key = hmac(b"AWS4secret/key", "20231114");
        let key = hmac(&key, "eu-west-1");
        let key = hmac(&key, "sqs");
        let key = hmac(&key, "aws4_request");
        let signature = hex::encode(hmac(&key, &to_sign));
        assert_eq!(
            h["authorization"],
            format!(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/{scope}, SignedHeaders=content-type;host;x-amz-date;x-amz-target, Signature={signature}"
            )
        );

        let temporary = Credentials::new("ASIA", "s", Some("token/+=".into()), None, "test");
        let head = request_head(
            line.as_bytes(),
            &host,
            &signer,
            &temporary,
            Action::ReceiveMessage,
            b"{}",
            now,
        )
        .unwrap();
        let h = headers(&head);
        assert_eq!(h["x-amz-security-token"], "token/+=");
        assert!(h["authorization"].contains("x-amz-security-token"));

        // A token with a line break would smuggle a header: refused, naming the credentials.
        let broken = Credentials::new("ASIA", "s", Some("tok\r\nx-evil: 1".into()), None, "test");
        let e = request_head(
            line.as_bytes(),
            &host,
            &signer,
            &broken,
            Action::ReceiveMessage,
            b"{}",
            now,
        )
        .unwrap_err();
        assert!(e.contains("session token"), "{e}");
    }
}
