//! Idempotency: a key per message (message id, a JSON pointer into the body, or an attribute) and a
//! store that marks the key in progress, then done, so redeliveries and duplicate sends skip the handler.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::api::IdempotencyKey;

use super::sqs::Message;

/// Why an idempotency key or store call failed.
#[derive(Debug, thiserror::Error)]
pub enum IdempotencyError {
    #[error("message body is not JSON, so the key {pointer} cannot be read: {reason}")]
    ParseBody { pointer: String, reason: String },
    #[error("message has nothing at {pointer} (or null there)")]
    MissingPointer { pointer: String },
    #[error("message has no attribute {name}")]
    MissingAttribute { name: String },
    #[error("attribute {name} is binary; idempotency keys need a String or Number attribute")]
    BinaryAttribute { name: String },
    #[error("the key from {key_source} is empty or only whitespace")]
    EmptyKey { key_source: String },
    #[error("cannot connect to redis at {url}: {reason} (check --redis-url)")]
    ConnectRedis { url: String, reason: String },
    #[error("redis call {step} failed: {reason}")]
    CallRedis { step: &'static str, reason: String },
    #[error("the store did not answer the claim within the handler timeout plus 10s")]
    TimedOut,
}

/// The message's idempotency key according to `--idempotency-key`. An empty or whitespace-only key
/// is an error, never a key: messages sharing it would all count as duplicates of the first.
pub fn key_of(spec: &IdempotencyKey, msg: &Message) -> Result<String, IdempotencyError> {
    let key = raw_key(spec, msg)?;
    if key.trim().is_empty() {
        return Err(IdempotencyError::EmptyKey {
            key_source: spec.to_string(),
        });
    }
    Ok(key)
}

fn raw_key(spec: &IdempotencyKey, msg: &Message) -> Result<String, IdempotencyError> {
    match spec {
        IdempotencyKey::MessageId => Ok(msg.id.clone()),
        IdempotencyKey::JsonPointer(pointer) => {
            let value: serde_json::Value =
                serde_json::from_slice(&msg.body).map_err(|e| IdempotencyError::ParseBody {
                    pointer: pointer.clone(),
                    reason: e.to_string(),
                })?;
            match value.pointer(pointer) {
                None | Some(serde_json::Value::Null) => Err(IdempotencyError::MissingPointer {
                    pointer: pointer.clone(),
                }),
                Some(v) => Ok(json_key(v)),
            }
        }
        IdempotencyKey::Attribute(name) => {
            let attr = msg
                .attribute(name)
                .ok_or_else(|| IdempotencyError::MissingAttribute { name: name.clone() })?;
            attr.string
                .clone()
                .ok_or_else(|| IdempotencyError::BinaryAttribute { name: name.clone() })
        }
    }
}

/// Marks a key that is a JSON value's text rather than a string's own value. A control character no
/// real key starts with (SOH).
const JSON_KEY_MARK: char = '\u{1}';

/// The key of a JSON value, type-distinct (#40: `1` and `"1"` are two orders, not one): a string is
/// its value as is, so string keys are what they always were; any other value (number, boolean,
/// array, object) is `JSON_KEY_MARK` followed by its compact JSON text, which never starts with `"`.
/// A string that itself starts with the mark is encoded the same way, as its JSON text (starting
/// with `"`), so no string can equal another value's key and no two strings share one.
fn json_key(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) if !s.starts_with(JSON_KEY_MARK) => s.clone(),
        other => format!("{JSON_KEY_MARK}{other}"),
    }
}

/// What the store said when a message asked for its key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// This worker holds the key now; `token` proves it when abandoning.
    Acquired { token: String },
    /// The key's work is done: delete the message without calling the handler.
    Done,
    /// Someone else is processing the key: hide the message until the claim can have ended.
    /// `remaining` is the claim's time to live (None: the store could not say).
    InProgress { remaining: Option<Duration> },
}

pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
}

impl Store {
    /// Marks `key` in progress for `lease` unless it is already in progress or done.
    pub async fn claim(&self, key: &str, lease: Duration) -> Result<Claim, IdempotencyError> {
        match self {
            Store::Memory(m) => Ok(m.claim(key, lease, Instant::now())),
            Store::Redis(r) => r.claim(key, lease).await,
        }
    }

    /// Extends our claim on `key` (proved by `token`) so it lives at least `ttl` from now; never
    /// shortens it. False if the claim is no longer ours (it expired, and maybe someone took the key).
    pub async fn renew(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, IdempotencyError> {
        match self {
            Store::Memory(m) => Ok(m.renew(key, token, ttl, Instant::now())),
            Store::Redis(r) => r.renew(key, token, ttl).await,
        }
    }

    /// Marks `key` done for `ttl`.
    pub async fn complete(&self, key: &str, ttl: Duration) -> Result<(), IdempotencyError> {
        match self {
            Store::Memory(m) => {
                m.complete(key, ttl, Instant::now());
                Ok(())
            }
            Store::Redis(r) => r.complete(key, ttl).await,
        }
    }

    /// Checks that the store answers (redis PING); the memory store always does.
    pub async fn ping(&self) -> Result<(), IdempotencyError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(r) => r.ping().await,
        }
    }

    /// Drops our in-progress mark after a failure, so the next delivery can run the handler.
    pub async fn abandon(&self, key: &str, token: &str) -> Result<(), IdempotencyError> {
        match self {
            Store::Memory(m) => {
                m.abandon(key, token);
                Ok(())
            }
            Store::Redis(r) => r.abandon(key, token).await,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    InProgress(u64),
    Done,
}

struct MemoryInner {
    entries: HashMap<String, (State, Instant)>,
    /// Insertion order for eviction; may hold keys already replaced or removed.
    order: VecDeque<String>,
    next_token: u64,
}

/// A per-process store: bounded (oldest keys evicted first) and with expiry.
pub struct MemoryStore {
    inner: Mutex<MemoryInner>,
    capacity: usize,
}

impl MemoryStore {
    pub fn new(capacity: usize) -> Self {
        MemoryStore {
            inner: Mutex::new(MemoryInner {
                entries: HashMap::new(),
                order: VecDeque::new(),
                next_token: 1,
            }),
            capacity: capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().map_or(0, |g| g.entries.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn claim(&self, key: &str, lease: Duration, now: Instant) -> Claim {
        let Ok(mut g) = self.inner.lock() else {
            return Claim::InProgress { remaining: None };
        };
        if let Some((state, expires)) = g.entries.get(key)
            && *expires > now
        {
            return match state {
                State::Done => Claim::Done,
                State::InProgress(_) => Claim::InProgress {
                    remaining: Some(*expires - now),
                },
            };
        }
        let token = g.next_token;
        g.next_token += 1;
        g.entries
            .insert(key.to_string(), (State::InProgress(token), now + lease));
        g.order.push_back(key.to_string());
        self.evict(&mut g, now);
        Claim::Acquired {
            token: token.to_string(),
        }
    }

    fn complete(&self, key: &str, ttl: Duration, now: Instant) {
        if let Ok(mut g) = self.inner.lock() {
            let fresh = g
                .entries
                .insert(key.to_string(), (State::Done, now + ttl))
                .is_none();
            if fresh {
                g.order.push_back(key.to_string());
                self.evict(&mut g, now);
            }
        }
    }

    fn renew(&self, key: &str, token: &str, ttl: Duration, now: Instant) -> bool {
        let Ok(mut g) = self.inner.lock() else {
            return false;
        };
        match g.entries.get_mut(key) {
            Some((State::InProgress(t), expires)) if *expires > now && t.to_string() == token => {
                *expires = (*expires).max(now + ttl);
                true
            }
            _ => false,
        }
    }

    fn abandon(&self, key: &str, token: &str) {
        if let Ok(mut g) = self.inner.lock()
            && let Some((State::InProgress(t), _)) = g.entries.get(key)
            && t.to_string() == token
        {
            g.entries.remove(key);
        }
    }

    fn evict(&self, g: &mut MemoryInner, now: Instant) {
        // Expired entries at the front go first; then the oldest, while over capacity.
        while let Some(front) = g.order.front().cloned() {
            let remove = match g.entries.get(&front) {
                None => false,
                Some((_, expires)) if *expires <= now => true,
                Some(_) if g.entries.len() > self.capacity => true,
                Some(_) => break,
            };
            g.order.pop_front();
            if remove {
                g.entries.remove(&front);
            }
        }
        // Keys re-added after removal leave stale order slots; keep the deque from outgrowing the map.
        if g.order.len() > 2 * self.capacity {
            let entries = &g.entries;
            let mut seen = std::collections::HashSet::new();
            let kept: VecDeque<String> = g
                .order
                .iter()
                .filter(|k| entries.contains_key(*k) && seen.insert((*k).clone()))
                .cloned()
                .collect();
            g.order = kept;
        }
    }
}

/// Redis store: `SET key in-progress NX PX lease`, then `SET key done PX ttl`.
pub struct RedisStore {
    conn: redis::aio::ConnectionManager,
    prefix: String,
    owner: String,
}

const DONE: &str = "done";
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

impl RedisStore {
    /// Connects to `url`, trusting `roots` for rediss://; keys are `{prefix}{key}`.
    pub async fn connect(
        url: &str,
        prefix: String,
        roots: &crate::roots::Roots,
    ) -> Result<Self, IdempotencyError> {
        let connect_err = |reason: String| IdempotencyError::ConnectRedis {
            url: redact(url),
            reason,
        };
        if url.starts_with("rediss://") {
            // Two rustls providers are compiled in (the AWS SDK's and ours), and rustls will not
            // pick one itself; an already installed one is fine.
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        }
        let client = match roots.redis_root_cert() {
            // No system roots: the bundle beside qc-worker (redis's own trust-store setting).
            Some(root_cert) if url.starts_with("rediss://") => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root_cert),
                },
            ),
            _ => redis::Client::open(url),
        }
        .map_err(|e| connect_err(e.to_string()))?;
        // Few, quick reconnect attempts: the caller retries with its own backoff, and the manager's
        // default (6 attempts, up to 3.2 s apart) would outlast the connect timeout below and hide the
        // real reason ("invalid peer certificate", "connection refused") behind "timed out".
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CALL_TIMEOUT))
            .set_response_timeout(Some(CALL_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let conn = tokio::time::timeout(
            CALL_TIMEOUT * 2,
            redis::aio::ConnectionManager::new_with_config(client, config),
        )
        .await
        .map_err(|_| connect_err("timed out".into()))?
        .map_err(|e| connect_err(e.to_string()))?;
        let owner = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        Ok(RedisStore {
            conn,
            prefix,
            owner,
        })
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    async fn call<T: redis::FromRedisValue>(
        &self,
        step: &'static str,
        cmd: redis::Cmd,
    ) -> Result<T, IdempotencyError> {
        let mut conn = self.conn.clone();
        bounded(step, cmd.query_async(&mut conn)).await
    }

    async fn claim(&self, key: &str, lease: Duration) -> Result<Claim, IdempotencyError> {
        let rkey = self.redis_key(key);
        let token = format!("{}:{}", self.owner, fastrand::u64(..));
        let value = format!("in-progress:{token}");
        let lease_ms = millis(lease);
        // One script, so the answer (ours, done, or someone else's with its time to live) is read
        // atomically with the SET NX.
        let script = redis::Script::new(
            "if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, '', 0} end \
             return {0, redis.call('GET', KEYS[1]) or '', redis.call('PTTL', KEYS[1])}",
        );
        let mut invocation = script.key(rkey);
        invocation.arg(&value).arg(lease_ms);
        let (acquired, current, pttl): (i64, String, i64) =
            self.invoke("claim", invocation).await?;
        Ok(if acquired == 1 {
            Claim::Acquired { token }
        } else if current == DONE {
            Claim::Done
        } else {
            // PTTL: -1 no expiry, -2 gone (neither happens to a claim of ours): unknown.
            Claim::InProgress {
                remaining: u64::try_from(pttl)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(Duration::from_millis),
            }
        })
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, IdempotencyError> {
        let script = redis::Script::new(
            "if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end \
             if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
             return 1",
        );
        let mut invocation = script.key(self.redis_key(key));
        invocation
            .arg(format!("in-progress:{token}"))
            .arg(millis(ttl));
        let ours: i64 = self.invoke("renew", invocation).await?;
        Ok(ours == 1)
    }

    async fn invoke<T: redis::FromRedisValue>(
        &self,
        step: &'static str,
        invocation: redis::ScriptInvocation<'_>,
    ) -> Result<T, IdempotencyError> {
        let mut conn = self.conn.clone();
        bounded(step, invocation.invoke_async::<T>(&mut conn)).await
    }

    async fn ping(&self) -> Result<(), IdempotencyError> {
        let _: String = self.call("PING", redis::cmd("PING")).await?;
        Ok(())
    }

    async fn complete(&self, key: &str, ttl: Duration) -> Result<(), IdempotencyError> {
        let ttl_ms = millis(ttl);
        let mut set = redis::cmd("SET");
        set.arg(self.redis_key(key)).arg(DONE).arg("PX").arg(ttl_ms);
        let _: Option<String> = self.call("SET done", set).await?;
        Ok(())
    }

    async fn abandon(&self, key: &str, token: &str) -> Result<(), IdempotencyError> {
        // Delete only our own in-progress mark: another worker may hold the key by now.
        let script = redis::Script::new(
            "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end",
        );
        let mut invocation = script.key(self.redis_key(key));
        invocation.arg(format!("in-progress:{token}"));
        let _: i64 = self.invoke("release", invocation).await?;
        Ok(())
    }
}

/// A Redis call bounded by CALL_TIMEOUT; a failure or timeout names the step it was for.
async fn bounded<T>(
    step: &'static str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, IdempotencyError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(IdempotencyError::CallRedis {
            step,
            reason: e.to_string(),
        }),
        Err(_) => Err(IdempotencyError::CallRedis {
            step,
            reason: "timed out".into(),
        }),
    }
}

/// Milliseconds for PX/PEXPIRE: at least 1.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// The URL without its password, for logs.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &url[..s], &url[at + 1..]),
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::worker::sqs::AttributeValue;

    fn msg(body: &str) -> Message {
        Message {
            id: "m-1".into(),
            receipt_handle: "rh".into(),
            body: bytes::Bytes::from(body.to_string()),
            receive_count: 1,
            group_id: None,
            deduplication_id: None,
            sequence_number: None,
            sent_timestamp: None,
            first_receive_timestamp: None,
            attributes: vec![
                (
                    "orderId".into(),
                    AttributeValue {
                        data_type: "String".into(),
                        string: Some("o-7".into()),
                        binary: None,
                    },
                ),
                (
                    "blob".into(),
                    AttributeValue {
                        data_type: "Binary".into(),
                        string: None,
                        binary: Some(vec![1, 2]),
                    },
                ),
            ],
            trace_header: None,
            received_at: Instant::now(),
        }
    }

    #[test]
    fn empty_and_blank_keys_are_no_keys() {
        let p = IdempotencyKey::JsonPointer("/orderId".into());
        for body in [
            r#"{"orderId":""}"#,
            r#"{"orderId":"  "}"#,
            "{\"orderId\":\"\\t\\n\"}",
        ] {
            match key_of(&p, &msg(body)) {
                Err(IdempotencyError::EmptyKey { key_source }) => {
                    assert_eq!(key_source, "jsonPointer:/orderId");
                }
                other => panic!("{body}: {other:?}"),
            }
        }
        assert_eq!(key_of(&p, &msg(r#"{"orderId":" o-1 "}"#)).unwrap(), " o-1 ");
    }

    #[test]
    fn keys_from_id_pointer_and_attribute() {
        let m = msg(r#"{"order":{"id":42,"ref":"r-1"},"n":null}"#);
        assert_eq!(key_of(&IdempotencyKey::MessageId, &m).unwrap(), "m-1");
        let p = |s: &str| IdempotencyKey::JsonPointer(s.into());
        assert_eq!(key_of(&p("/order/ref"), &m).unwrap(), "r-1");
        assert!(matches!(
            key_of(&p("/n"), &m),
            Err(IdempotencyError::MissingPointer { .. })
        ));
        assert!(matches!(
            key_of(&p("/missing"), &m),
            Err(IdempotencyError::MissingPointer { .. })
        ));
        assert!(matches!(
            key_of(&p("/a"), &msg("not json \u{1F600}")),
            Err(IdempotencyError::ParseBody { .. })
        ));
        assert_eq!(key_of(&p("/order/id"), &m).unwrap(), "\u{1}42");
        let a = |s: &str| IdempotencyKey::Attribute(s.into());
        assert_eq!(key_of(&a("orderId"), &m).unwrap(), "o-7");
        assert!(matches!(
            key_of(&a("blob"), &m),
            Err(IdempotencyError::BinaryAttribute { .. })
        ));
        assert!(matches!(
            key_of(&a("nope"), &m),
            Err(IdempotencyError::MissingAttribute { .. })
        ));
    }

    /// #40: a JSON pointer's key is type-distinct: `1` and `"1"` (and `true` and `"true"`, an
    /// object and its text) are different keys; strings keep their value as the key.
    #[test]
    fn keys_of_different_json_types_never_collide() {
        let p = IdempotencyKey::JsonPointer("/k".into());
        let key = |body: &str| key_of(&p, &msg(body)).unwrap();
        assert_eq!(key(r#"{"k":"o-1"}"#), "o-1", "a string is its value");
        assert_eq!(key(r#"{"k":"1"}"#), "1");
        let values = [
            r#""1""#,
            "1",
            "1.0",
            "-1",
            r#""true""#,
            "true",
            "false",
            r#""[1]""#,
            "[1]",
            r#""{\"a\":1}""#,
            r#"{"a":1}"#,
            // A string that looks like another value's key, mark included.
            r#""\u00011""#,
            r#""\u0001\"1\"""#,
            r#""\u0001""#,
        ];
        let keys: Vec<String> = values
            .iter()
            .map(|v| key(&format!(r#"{{"k":{v}}}"#)))
            .collect();
        for (i, a) in keys.iter().enumerate() {
            for (j, b) in keys.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{} and {} share a key", values[i], values[j]);
            }
        }
        // Equal values give equal keys, however the body spells them.
        assert_eq!(key(r#"{"k": {"a": 1}}"#), key(r#"{"k":{"a":1}}"#));
        assert_eq!(key(r#"{"k": 7}"#), key(r#"{"k":7}"#));
    }

    #[test]
    fn memory_store_claims_completes_and_expires() {
        let s = MemoryStore::new(100);
        let t0 = Instant::now();
        let lease = Duration::from_secs(10);
        let Claim::Acquired { token } = s.claim("k", lease, t0) else {
            panic!("first claim must acquire")
        };
        let in_progress = |left| Claim::InProgress {
            remaining: Some(Duration::from_secs(left)),
        };
        assert_eq!(s.claim("k", lease, t0), in_progress(10));
        assert_eq!(
            s.claim("k", lease, t0 + Duration::from_secs(4)),
            in_progress(6),
            "the claim's time left"
        );
        s.abandon("k", "not-the-token");
        assert_eq!(s.claim("k", lease, t0), in_progress(10));
        // Renewal extends (never shortens) the holder's claim only.
        assert!(!s.renew("k", "not-the-token", Duration::from_secs(30), t0));
        assert!(s.renew("k", &token, Duration::from_secs(30), t0));
        assert!(s.renew("k", &token, Duration::from_secs(1), t0));
        assert_eq!(s.claim("k", lease, t0), in_progress(30));
        s.abandon("k", &token);
        assert!(matches!(s.claim("k", lease, t0), Claim::Acquired { .. }));
        assert!(
            !s.renew("k", &token, lease, t0),
            "abandoned: no longer ours"
        );
        s.complete("k", Duration::from_mins(1), t0);
        assert_eq!(
            s.claim("k", lease, t0 + Duration::from_secs(59)),
            Claim::Done
        );
        assert!(matches!(
            s.claim("k", lease, t0 + Duration::from_secs(61)),
            Claim::Acquired { .. }
        ));
        // An in-progress mark whose lease ran out (crashed worker) can be taken over.
        assert!(matches!(
            s.claim("k", lease, t0 + Duration::from_secs(72)),
            Claim::Acquired { .. }
        ));
    }

    #[test]
    fn memory_store_is_bounded() {
        let s = MemoryStore::new(10);
        let t0 = Instant::now();
        for i in 0..1000 {
            let k = format!("k{i}");
            s.claim(&k, Duration::from_mins(1), t0);
            s.complete(&k, Duration::from_hours(1), t0);
        }
        assert!(s.len() <= 10, "{}", s.len());
        assert_eq!(
            s.claim("k999", Duration::from_secs(1), t0),
            Claim::Done,
            "the newest keys stay"
        );
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact("redis://:secret@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(
            redact("rediss://user:pw@cache.example:6380"),
            "rediss://***@cache.example:6380"
        );
    }
}
