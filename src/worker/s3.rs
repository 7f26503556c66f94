//! `--s3-payloads`: messages of the Amazon SQS Extended Client (Java, Python) whose payload is in
//! S3. Their body is a pointer, `["software.amazon.payloadoffloading.PayloadS3Pointer",
//! {"s3BucketName": "...", "s3Key": "..."}]`, with the payload's size in the `ExtendedPayloadSize`
//! attribute (`SQSLargePayloadSize` in older clients). The worker fetches the object (with its own
//! identity, up to a size cap) and hands the handler its bytes as the body, without the size
//! attribute; retries, the DLQ and redrive keep the pointer. Pure detection and view here; the S3
//! calls through aws-sdk-s3.

use bytes::Bytes;

use super::sqs::Message;

/// The first element of a pointer body.
pub const POINTER_CLASS: &str = "software.amazon.payloadoffloading.PayloadS3Pointer";
/// Attributes the Extended Client adds to name the payload's size; not passed to the handler.
pub const SIZE_ATTRIBUTES: [&str; 2] = ["ExtendedPayloadSize", "SQSLargePayloadSize"];
/// Default cap of a fetched payload (`--s3-payload-max`).
pub const DEFAULT_MAX_BYTES: u64 = 64 * 1024 * 1024;

/// Where a message's payload is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pointer {
    pub bucket: String,
    pub key: String,
}

/// Bytes of payload in flight are counted in KiB (a semaphore's permits are u32 per acquire).
const UNIT: u64 = 1024;

/// Without a container memory limit (or `--s3-payload-budget`): bytes of payloads held at once.
pub const DEFAULT_BUDGET: u64 = 512 * 1024 * 1024;

/// The default budget: half the container's memory limit (cgroup v2 `memory.max`, else v1
/// `memory.limit_in_bytes`), the other half left for the worker itself, the read buffers and the
/// handler's copy of what it is sent; `DEFAULT_BUDGET` where no limit is set.
pub fn default_budget() -> u64 {
    let read = |path: &str| std::fs::read_to_string(path).ok();
    read("/sys/fs/cgroup/memory.max")
        .and_then(|t| memory_limit(&t))
        .or_else(|| {
            read("/sys/fs/cgroup/memory/memory.limit_in_bytes").and_then(|t| memory_limit(&t))
        })
        .map_or(DEFAULT_BUDGET, |limit| limit / 2)
}

/// A cgroup memory limit file's value: None for "max" or v1's "no limit" (a page-rounded i64::MAX).
fn memory_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// Payload bytes held at once (`--s3-payload-budget`): a fetch takes its object's size from it
/// before reading, and the payload gives it back when the last copy of its bytes is dropped (after
/// the handler call). Past it, fetches wait; none ever reads beyond it.
#[derive(Clone)]
pub struct Budget {
    units: std::sync::Arc<tokio::sync::Semaphore>,
    bytes: u64,
}

impl Budget {
    pub fn new(bytes: u64) -> Budget {
        let units = usize::try_from(bytes / UNIT)
            .unwrap_or(usize::MAX)
            .clamp(1, tokio::sync::Semaphore::MAX_PERMITS);
        Budget {
            units: std::sync::Arc::new(tokio::sync::Semaphore::new(units)),
            bytes,
        }
    }

    /// Bytes not taken now.
    pub fn available(&self) -> u64 {
        self.units.available_permits() as u64 * UNIT
    }

    /// Waits until `len` bytes are free and takes them; None if `len` is over the whole budget.
    async fn take(&self, len: u64) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let units = u32::try_from(len.div_ceil(UNIT).max(1)).ok()?;
        if u64::from(units) * UNIT > self.bytes.max(UNIT) {
            return None;
        }
        self.units.clone().acquire_many_owned(units).await.ok()
    }
}

/// A payload's bytes with its share of the budget, given back on drop.
struct Held {
    data: Vec<u8>,
    _share: tokio::sync::OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        &self.data
    }
}

/// Objects this worker deleted (`--s3-delete-after`), newest kept: a later pointer at one of them is
/// a copy of a message already handled (a duplicate delivery), not a dangling pointer.
#[derive(Default)]
struct Deleted {
    set: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

/// How many deleted objects are remembered.
const DELETED_KEPT: usize = 100_000;

impl Deleted {
    fn insert(&mut self, id: String) {
        if self.set.insert(id.clone()) {
            self.order.push_back(id);
            while self.order.len() > DELETED_KEPT {
                if let Some(old) = self.order.pop_front() {
                    self.set.remove(&old);
                }
            }
        }
    }
}

impl std::fmt::Display for Pointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

/// The pointer of a message whose body is one: None for any other body; Err with the reason for a
/// body that names the pointer class but is malformed (poison: it can never be fetched).
pub fn pointer_of(msg: &Message) -> Option<Result<Pointer, String>> {
    let body = msg.body.trim_ascii_start();
    let rest = body.strip_prefix(b"[")?.trim_ascii_start();
    let class = format!("\"{POINTER_CLASS}\"");
    if !rest.starts_with(class.as_bytes()) {
        return None;
    }
    let parsed = serde_json::from_slice::<serde_json::Value>(&msg.body)
        .map_err(|e| format!("an S3 pointer body that is not JSON: {e}"))
        .and_then(|v| {
            let fields = v
                .get(1)
                .filter(|_| v.as_array().is_some_and(|a| a.len() == 2))
                .ok_or("an S3 pointer body that is not [class, {s3BucketName, s3Key}]")?;
            let text = |name: &str| {
                fields
                    .get(name)
                    .and_then(serde_json::Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .ok_or_else(|| format!("an S3 pointer without a string {name}"))
            };
            Ok(Pointer {
                bucket: text("s3BucketName")?,
                key: text("s3Key")?,
            })
        });
    Some(parsed)
}

/// What the handler gets: the message with the payload as its body and without the size attribute.
pub fn view_with(msg: &Message, payload: Bytes) -> Message {
    Message {
        body: payload,
        attributes: msg
            .attributes
            .iter()
            .filter(|(n, _)| !SIZE_ATTRIBUTES.contains(&n.as_str()))
            .cloned()
            .collect(),
        ..msg.clone()
    }
}

/// Why a payload could not be fetched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchError {
    /// It can never be fetched: a bucket not allowed (`--s3-bucket`), the object or bucket does not
    /// exist, access is denied, or it is over the cap.
    Poison(String),
    /// It may be fetched later: S3 unreachable, throttled, a server error.
    Transient(String),
    /// The object is gone because this worker deleted it after handling a message that pointed at
    /// it (`--s3-delete-after`): this message is a copy of one already handled.
    Duplicate(String),
}

/// `--s3-payloads`' settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// `--s3-delete-after`: delete the object once the message's delete is confirmed.
    pub delete_after: bool,
    /// `--s3-payload-max`: the largest payload fetched.
    pub max_bytes: u64,
    /// `--s3-bucket`: the buckets (names or `*`/`?` patterns) payloads may come from; a pointer into
    /// any other is poison before any S3 call.
    pub buckets: Vec<String>,
    /// `--s3-payload-budget`: payload bytes held at once ([`default_budget`] when not given).
    pub budget: u64,
}

impl Settings {
    /// Whether a pointer may be followed into `bucket`.
    pub fn allows(&self, bucket: &str) -> bool {
        self.buckets
            .iter()
            .any(|p| crate::tenancy::glob_matches(p, bucket))
    }
}

/// The S3 client and settings of `--s3-payloads`.
pub struct S3Payloads {
    client: aws_sdk_s3::Client,
    settings: Settings,
    budget: Budget,
    deleted: std::sync::Mutex<Deleted>,
    /// `--s3-delete-after`: delete the object once the message's delete is confirmed.
    pub delete_after: bool,
}

impl S3Payloads {
    /// From the worker's SDK configuration (its identity, region, endpoint and HTTP client); with an
    /// endpoint override (an emulator) path-style addressing.
    pub fn new(sdk: &aws_types::SdkConfig, settings: Settings) -> S3Payloads {
        let conf = aws_sdk_s3::config::Builder::from(sdk)
            .force_path_style(sdk.endpoint_url().is_some())
            .build();
        S3Payloads {
            client: aws_sdk_s3::Client::from_conf(conf),
            delete_after: settings.delete_after,
            budget: Budget::new(settings.budget),
            deleted: std::sync::Mutex::new(Deleted::default()),
            settings,
        }
    }

    /// The object's bytes, read up to the cap (a longer object is refused before and while it is read).
    /// A bucket `--s3-bucket` does not allow is refused before any call.
    pub async fn fetch(&self, p: &Pointer) -> Result<Bytes, FetchError> {
        if !self.settings.allows(&p.bucket) {
            return Err(FetchError::Poison(format!(
                "the S3 payload {p} is in bucket {:?}, which this consumer does not fetch from (handler.s3Payloads.buckets / --s3-bucket allows {}); it was not fetched: send payloads to an allowed bucket, or add the bucket to handler.s3Payloads.buckets",
                p.bucket,
                self.settings.buckets.join(", ")
            )));
        }
        let out = self
            .client
            .get_object()
            .bucket(&p.bucket)
            .key(&p.key)
            .send()
            .await
            .map_err(|e| {
                let err = fetch_error(p, &e);
                let ours = self
                    .deleted
                    .lock()
                    .is_ok_and(|d| d.set.contains(&p.to_string()));
                match err {
                    FetchError::Poison(reason) if ours && no_such_key(&e) => FetchError::Duplicate(format!(
                        "the S3 payload {p} was deleted by this worker after a message pointing at it was handled: this one is a copy of it ({reason})"
                    )),
                    other => other,
                }
            })?;
        let cap = self.settings.max_bytes;
        let len = out.content_length.and_then(|l| u64::try_from(l).ok());
        if let Some(len) = len
            && len > cap
        {
            return Err(too_large(p, len, cap));
        }
        // The object's size (or, not told, the cap) is taken from the budget before a byte is read;
        // the body waits unread meanwhile.
        let want = len.unwrap_or(cap);
        let Some(share) = self.budget.take(want).await else {
            return Err(FetchError::Poison(format!(
                "the S3 payload {p} is {want} bytes, more than this worker may hold at once ({} bytes, --s3-payload-budget: half the container's memory limit by default); raise worker.resources.limits.memory",
                self.budget.bytes
            )));
        };
        let mut body = out.body;
        let mut data = Vec::with_capacity(usize::try_from(len.unwrap_or(0)).unwrap_or(0));
        loop {
            match body.try_next().await {
                Ok(Some(chunk)) => {
                    let upto = (data.len() + chunk.len()) as u64;
                    if upto > cap {
                        return Err(too_large(p, upto, cap));
                    }
                    if upto > want {
                        // Longer than S3 said: never beyond what was taken from the budget.
                        return Err(FetchError::Transient(format!(
                            "the S3 payload {p} ran past its Content-Length of {want} bytes"
                        )));
                    }
                    data.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    return Err(FetchError::Transient(format!(
                        "reading the S3 payload {p} failed: {e}"
                    )));
                }
            }
        }
        Ok(Bytes::from_owner(Held {
            data,
            _share: share,
        }))
    }

    /// Payload bytes that may be taken now (for tests and logs).
    pub fn budget_available(&self) -> u64 {
        self.budget.available()
    }

    /// Deletes the object (best effort: a failure is logged, the object stays).
    pub async fn delete(&self, p: &Pointer, message_id: &str) {
        match self
            .client
            .delete_object()
            .bucket(&p.bucket)
            .key(&p.key)
            .send()
            .await
        {
            Ok(_) => {
                if let Ok(mut d) = self.deleted.lock() {
                    d.insert(p.to_string());
                }
                tracing::debug!(message_id, payload = %p, "S3 payload deleted");
            }
            Err(e) => {
                tracing::warn!(message_id, payload = %p, error = %aws_sdk_s3::error::DisplayErrorContext(&e), "cannot delete the S3 payload of a handled message; it stays in the bucket");
            }
        }
    }
}

/// S3 errors that no retry can mend are poison: the object or bucket is missing, or this worker's
/// identity may not read it (an IAM refusal is the bucket's owner saying no, not an outage, and must
/// not open the breaker). Anything else (throttling, 5xx, no connection) is transient.
const POISON_CODES: [&str; 6] = [
    "NoSuchKey",
    "NoSuchBucket",
    "AccessDenied",
    "AllAccessDisabled",
    "InvalidBucketName",
    "InvalidObjectState",
];

fn fetch_error(
    p: &Pointer,
    e: &aws_sdk_s3::error::SdkError<
        aws_sdk_s3::operation::get_object::GetObjectError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> FetchError {
    use aws_sdk_s3::error::ProvideErrorMetadata as _;
    let code = e.code().unwrap_or_default().to_string();
    let status = e.raw_response().map(|r| r.status().as_u16());
    let poison = matches!(
        e.as_service_error(),
        Some(aws_sdk_s3::operation::get_object::GetObjectError::NoSuchKey(_))
    ) || POISON_CODES.contains(&code.as_str())
        || (code.is_empty() && matches!(status, Some(403 | 404)));
    let detail = aws_sdk_s3::error::DisplayErrorContext(e).to_string();
    if poison {
        FetchError::Poison(format!(
            "the S3 payload {p} cannot be fetched: S3 answered {} ({}, HTTP {}); the message can never be handled",
            if code.is_empty() {
                "no error code"
            } else {
                &code
            },
            e.message().unwrap_or("no message"),
            status.map_or_else(|| "-".to_string(), |s| s.to_string()),
        ))
    } else {
        FetchError::Transient(format!("cannot fetch the S3 payload {p}: {detail}"))
    }
}

fn no_such_key(
    e: &aws_sdk_s3::error::SdkError<
        aws_sdk_s3::operation::get_object::GetObjectError,
        aws_smithy_runtime_api::http::Response,
    >,
) -> bool {
    use aws_sdk_s3::error::ProvideErrorMetadata as _;
    matches!(
        e.as_service_error(),
        Some(aws_sdk_s3::operation::get_object::GetObjectError::NoSuchKey(_))
    ) || e.code() == Some("NoSuchKey")
}

fn too_large(p: &Pointer, len: u64, cap: u64) -> FetchError {
    FetchError::Poison(format!(
        "the S3 payload {p} is {len} bytes or more, over the cap of {cap} (--s3-payload-max)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::sqs::AttributeValue;

    fn msg(body: &str) -> Message {
        Message {
            id: "m".into(),
            receipt_handle: "rh".into(),
            body: Bytes::copy_from_slice(body.as_bytes()),
            receive_count: 1,
            group_id: None,
            deduplication_id: None,
            sequence_number: None,
            sent_timestamp: None,
            first_receive_timestamp: None,
            attributes: vec![
                (
                    "ExtendedPayloadSize".into(),
                    AttributeValue {
                        data_type: "Number".into(),
                        string: Some("300000".into()),
                        binary: None,
                    },
                ),
                (
                    "tenant".into(),
                    AttributeValue {
                        data_type: "String".into(),
                        string: Some("t-1".into()),
                        binary: None,
                    },
                ),
            ],
            trace_header: None,
            handler_traceparent: None,
            received_at: std::time::Instant::now(),
        }
    }

    #[test]
    fn pointers_are_told_from_other_bodies() {
        let ok = msg(&format!(
            r#" ["{POINTER_CLASS}", {{"s3BucketName": "b", "s3Key": "k/1"}}]"#
        ));
        assert_eq!(
            pointer_of(&ok),
            Some(Ok(Pointer {
                bucket: "b".into(),
                key: "k/1".into()
            }))
        );
        for other in [r#"{"orderId": 1}"#, r#"["a", "b"]"#, "plain", ""] {
            assert_eq!(pointer_of(&msg(other)), None, "{other}");
        }
        for (bad, why) in [
            (
                format!(r#"["{POINTER_CLASS}", {{"s3Key": "k"}}]"#),
                "s3BucketName",
            ),
            (
                format!(r#"["{POINTER_CLASS}", {{"s3BucketName": "b", "s3Key": ""}}]"#),
                "s3Key",
            ),
            (format!(r#"["{POINTER_CLASS}"]"#), "not [class"),
            (format!(r#"["{POINTER_CLASS}", {{"#), "not JSON"),
        ] {
            let e = pointer_of(&msg(&bad)).unwrap().unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_budget_comes_from_the_cgroup_limit() {
        assert_eq!(memory_limit("134217728\n"), Some(134_217_728));
        assert_eq!(memory_limit("max\n"), None);
        assert_eq!(
            memory_limit("9223372036854771712\n"),
            None,
            "cgroup v1: no limit"
        );
        assert_eq!(memory_limit(""), None);
    }

    #[tokio::test]
    async fn a_payload_holds_its_share_until_its_last_copy_is_dropped() {
        let b = Budget::new(10 * 1024);
        let first = b.take(6 * 1024).await.unwrap();
        assert_eq!(b.available(), 4 * 1024);
        assert!(b.take(11 * 1024).await.is_none(), "over the whole budget");
        let payload = Bytes::from_owner(Held {
            data: vec![1; 10],
            _share: first,
        });
        let copy = payload.clone();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.take(6 * 1024).await.is_some() }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "waits while the payload is held");
        drop(payload);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "a copy still holds it");
        drop(copy);
        assert!(waiting.await.unwrap());
    }

    #[test]
    fn the_view_has_the_payload_and_no_size_attribute() {
        let m = msg("pointer");
        let v = view_with(&m, Bytes::from_static(b"payload"));
        assert_eq!(&v.body[..], b"payload");
        let names: Vec<&str> = v.attributes.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["tenant"]);
        assert_eq!(v.id, m.id);
        assert_eq!(v.receipt_handle, m.receipt_handle);
    }
}
