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
    #[error(
        "dynamodb call {step} failed: {reason} (check the table, its key attribute and the worker's dynamodb permissions)"
    )]
    CallDynamo { step: &'static str, reason: String },
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
    /// The key was claimed or done for another payload (a key reused for a different message):
    /// poison, with this reason. Only stores that keep a payload hash (dynamodb) answer this.
    Mismatch { reason: String },
}

pub enum Store {
    Memory(MemoryStore),
    Redis(RedisStore),
    DynamoDb(DynamoStore),
}

/// The payload hash a store keeps beside a key: SHA-256 of the body the handler gets, in hex.
pub fn payload_hash(body: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(body))
}

impl Store {
    /// Marks `key` in progress for `lease` unless it is already in progress or done. `hash`: the
    /// message's `payload_hash`, kept and compared by the stores that check payloads.
    pub async fn claim(
        &self,
        key: &str,
        lease: Duration,
        hash: &str,
    ) -> Result<Claim, IdempotencyError> {
        match self {
            Store::Memory(m) => Ok(m.claim(key, lease, Instant::now())),
            Store::Redis(r) => r.claim(key, lease).await,
            Store::DynamoDb(d) => d.claim(key, lease, hash).await,
        }
    }

    /// Whether `claim` compares payloads (answers `Mismatch`).
    pub fn checks_payload(&self) -> bool {
        matches!(self, Store::DynamoDb(_))
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
            Store::DynamoDb(d) => d.renew(key, token, ttl).await,
        }
    }

    /// Marks `key` done for `ttl` (with the payload's `hash` where the store keeps it).
    pub async fn complete(
        &self,
        key: &str,
        ttl: Duration,
        hash: &str,
    ) -> Result<(), IdempotencyError> {
        match self {
            Store::Memory(m) => {
                m.complete(key, ttl, Instant::now());
                Ok(())
            }
            Store::Redis(r) => r.complete(key, ttl).await,
            Store::DynamoDb(d) => d.complete(key, ttl, hash).await,
        }
    }

    /// Checks that the store answers (redis PING); the memory store always does.
    pub async fn ping(&self) -> Result<(), IdempotencyError> {
        match self {
            Store::Memory(_) => Ok(()),
            Store::Redis(r) => r.ping().await,
            Store::DynamoDb(d) => d.ping().await,
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
            Store::DynamoDb(d) => d.abandon(key, token).await,
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

/// `--dynamodb-table` and its attribute names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamoSettings {
    pub table: String,
    pub key_attribute: String,
    pub ttl_attribute: String,
}

/// DynamoDB's table-name rule: 3 to 255 of `[a-zA-Z0-9_.-]`.
pub fn valid_table_name(name: &str) -> bool {
    (3..=255).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// DynamoDB store: one item per key, `{key, status, token, leaseUntil, payloadHash, <ttl attribute>}`.
/// A claim is a PutItem conditional on no live item (none, or an in-progress one past its
/// `leaseUntil`, or a done one past its expiry that TTL has not removed yet); renewal and release
/// are conditional on our token. Expiry is read against this worker's clock (DynamoDB keeps no
/// time of its own): workers' clocks must agree within a lease's margin (`CLAIM_GRACE`).
pub struct DynamoStore {
    client: aws_sdk_dynamodb::Client,
    settings: DynamoSettings,
    prefix: String,
    owner: String,
}

const STATUS: &str = "status";
const TOKEN: &str = "token";
const LEASE_UNTIL: &str = "leaseUntil";
const PAYLOAD_HASH: &str = "payloadHash";
const IN_PROGRESS: &str = "in-progress";
/// An in-progress item outlives its lease this long in the table (removed by TTL after).
const DYNAMO_TTL_SLACK: Duration = Duration::from_hours(1);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn n(v: u64) -> aws_sdk_dynamodb::types::AttributeValue {
    aws_sdk_dynamodb::types::AttributeValue::N(v.to_string())
}

fn s(v: &str) -> aws_sdk_dynamodb::types::AttributeValue {
    aws_sdk_dynamodb::types::AttributeValue::S(v.to_string())
}

/// One stored item, as read back.
struct Item {
    status: String,
    token: String,
    lease_until_ms: u64,
    expires_s: u64,
    hash: String,
}

impl DynamoStore {
    pub fn new(sdk: &aws_types::SdkConfig, settings: DynamoSettings, prefix: String) -> Self {
        let owner = format!(
            "{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        );
        DynamoStore {
            client: aws_sdk_dynamodb::Client::new(sdk),
            settings,
            prefix,
            owner,
        }
    }

    fn item_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    fn names(&self) -> [(String, String); 6] {
        [
            ("#k".into(), self.settings.key_attribute.clone()),
            ("#s".into(), STATUS.into()),
            ("#tok".into(), TOKEN.into()),
            ("#l".into(), LEASE_UNTIL.into()),
            ("#t".into(), self.settings.ttl_attribute.clone()),
            ("#h".into(), PAYLOAD_HASH.into()),
        ]
    }

    async fn get(&self, key: &str, step: &'static str) -> Result<Option<Item>, IdempotencyError> {
        let got = dynamo_bounded(
            step,
            self.client
                .get_item()
                .table_name(&self.settings.table)
                .key(&self.settings.key_attribute, s(&self.item_key(key)))
                .consistent_read(true)
                .send(),
        )
        .await?;
        let Some(item) = got.item else {
            return Ok(None);
        };
        let text = |k: &str| {
            item.get(k)
                .and_then(|v| v.as_s().ok())
                .cloned()
                .unwrap_or_default()
        };
        let num = |k: &str| {
            item.get(k)
                .and_then(|v| v.as_n().ok())
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        Ok(Some(Item {
            status: text(STATUS),
            token: text(TOKEN),
            lease_until_ms: num(LEASE_UNTIL),
            expires_s: num(&self.settings.ttl_attribute),
            hash: text(PAYLOAD_HASH),
        }))
    }

    async fn claim(
        &self,
        key: &str,
        lease: Duration,
        hash: &str,
    ) -> Result<Claim, IdempotencyError> {
        let token = format!("{}:{}", self.owner, fastrand::u64(..));
        // A lost race with an item that then vanished (released, or expired and taken and
        // released) is tried again, a few times.
        for _ in 0..3 {
            let now = now_ms();
            let lease_until = now.saturating_add(millis(lease));
            let expires = (lease_until / 1000).saturating_add(DYNAMO_TTL_SLACK.as_secs());
            let mut put = self
                .client
                .put_item()
                .table_name(&self.settings.table)
                .item(&self.settings.key_attribute, s(&self.item_key(key)))
                .item(STATUS, s(IN_PROGRESS))
                .item(TOKEN, s(&token))
                .item(LEASE_UNTIL, n(lease_until))
                .item(&self.settings.ttl_attribute, n(expires))
                .item(PAYLOAD_HASH, s(hash))
                .condition_expression(
                    "attribute_not_exists(#k) OR (#s = :ip AND #l < :now) OR (#s = :done AND #t < :nows)",
                )
                .expression_attribute_values(":ip", s(IN_PROGRESS))
                .expression_attribute_values(":done", s(DONE))
                .expression_attribute_values(":now", n(now))
                .expression_attribute_values(":nows", n(now / 1000));
            for (k, v) in self.names() {
                if k != "#tok" && k != "#h" {
                    put = put.expression_attribute_names(k, v);
                }
            }
            match dynamo_call("claim", put.send()).await {
                Ok(_) => return Ok(Claim::Acquired { token }),
                Err(DynamoFailure::ConditionFailed) => {}
                Err(DynamoFailure::Other(e)) => return Err(e),
            }
            let Some(item) = self.get(key, "claim: read the holder").await? else {
                continue;
            };
            let now = now_ms();
            let live = if item.status == DONE {
                item.expires_s >= now / 1000
            } else {
                item.lease_until_ms >= now
            };
            if !live {
                continue;
            }
            // Our own write, landed though its answer was lost (the SDK sent it again): ours.
            if item.status == IN_PROGRESS && item.token == token {
                return Ok(Claim::Acquired { token });
            }
            if !item.hash.is_empty() && item.hash != hash {
                let state = if item.status == DONE {
                    "done"
                } else {
                    "in progress"
                };
                return Ok(Claim::Mismatch {
                    reason: format!(
                        "idempotency key {key} is already {state} for another payload (a different body under the same key): a reused key, not a duplicate"
                    ),
                });
            }
            return Ok(if item.status == DONE {
                Claim::Done
            } else {
                Claim::InProgress {
                    remaining: Some(Duration::from_millis(item.lease_until_ms - now)),
                }
            });
        }
        // Still racing after three tries: as if held elsewhere, for one lease (hidden, retried).
        Ok(Claim::InProgress { remaining: None })
    }

    async fn renew(&self, key: &str, token: &str, ttl: Duration) -> Result<bool, IdempotencyError> {
        let now = now_ms();
        let until = now.saturating_add(millis(ttl));
        let expires = (until / 1000).saturating_add(DYNAMO_TTL_SLACK.as_secs());
        let mut update = self
            .client
            .update_item()
            .table_name(&self.settings.table)
            .key(&self.settings.key_attribute, s(&self.item_key(key)))
            .update_expression("SET #l = :until, #t = :exp")
            .condition_expression("#s = :ip AND #tok = :tok AND #l >= :now AND #l < :until")
            .expression_attribute_values(":ip", s(IN_PROGRESS))
            .expression_attribute_values(":tok", s(token))
            .expression_attribute_values(":now", n(now))
            .expression_attribute_values(":until", n(until))
            .expression_attribute_values(":exp", n(expires));
        for (k, v) in self.names() {
            if k != "#k" && k != "#h" {
                update = update.expression_attribute_names(k, v);
            }
        }
        match dynamo_call("renew", update.send()).await {
            Ok(_) => Ok(true),
            // Not extended: still ours with a longer lease (never shortened), or not ours any more.
            Err(DynamoFailure::ConditionFailed) => Ok(self
                .get(key, "renew: read the holder")
                .await?
                .is_some_and(|i| {
                    i.status == IN_PROGRESS && i.token == token && i.lease_until_ms >= now
                })),
            Err(DynamoFailure::Other(e)) => Err(e),
        }
    }

    async fn complete(&self, key: &str, ttl: Duration, hash: &str) -> Result<(), IdempotencyError> {
        let expires = (now_ms() / 1000).saturating_add(ttl.as_secs().max(1));
        let put = self
            .client
            .put_item()
            .table_name(&self.settings.table)
            .item(&self.settings.key_attribute, s(&self.item_key(key)))
            .item(STATUS, s(DONE))
            .item(&self.settings.ttl_attribute, n(expires))
            .item(PAYLOAD_HASH, s(hash));
        // Unconditional: no condition to fail.
        match dynamo_call("complete", put.send()).await {
            Ok(_) | Err(DynamoFailure::ConditionFailed) => Ok(()),
            Err(DynamoFailure::Other(e)) => Err(e),
        }
    }

    async fn abandon(&self, key: &str, token: &str) -> Result<(), IdempotencyError> {
        // Only our own in-progress mark: another worker may hold the key by now.
        let delete = self
            .client
            .delete_item()
            .table_name(&self.settings.table)
            .key(&self.settings.key_attribute, s(&self.item_key(key)))
            .condition_expression("#s = :ip AND #tok = :tok")
            .expression_attribute_names("#s", STATUS)
            .expression_attribute_names("#tok", TOKEN)
            .expression_attribute_values(":ip", s(IN_PROGRESS))
            .expression_attribute_values(":tok", s(token));
        match dynamo_call("release", delete.send()).await {
            Ok(_) | Err(DynamoFailure::ConditionFailed) => Ok(()),
            Err(DynamoFailure::Other(e)) => Err(e),
        }
    }

    async fn ping(&self) -> Result<(), IdempotencyError> {
        self.get("qc-ping", "ping").await.map(|_| ())
    }
}

/// A DynamoDB call that failed: its condition did not hold, or anything else.
enum DynamoFailure {
    ConditionFailed,
    Other(IdempotencyError),
}

/// A DynamoDB call bounded by CALL_TIMEOUT; a failed condition is told apart from a failure. The
/// SDK's future (some 20 KB) is boxed at once, so the message task's future stays small.
fn dynamo_call<'a, T: Send + 'a, E>(
    step: &'static str,
    call: impl Future<Output = Result<T, aws_sdk_dynamodb::error::SdkError<E>>> + Send + 'a,
) -> impl Future<Output = Result<T, DynamoFailure>> + Send + 'a
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let call = Box::pin(call);
    async move { dynamo_answer(step, tokio::time::timeout(CALL_TIMEOUT, call).await) }
}

fn dynamo_answer<T, E>(
    step: &'static str,
    answer: Result<Result<T, aws_sdk_dynamodb::error::SdkError<E>>, tokio::time::error::Elapsed>,
) -> Result<T, DynamoFailure>
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match answer {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            if e.as_service_error()
                .and_then(aws_sdk_dynamodb::error::ProvideErrorMetadata::code)
                == Some("ConditionalCheckFailedException")
            {
                Err(DynamoFailure::ConditionFailed)
            } else {
                Err(DynamoFailure::Other(IdempotencyError::CallDynamo {
                    step,
                    reason: crate::aws::error_chain(&e),
                }))
            }
        }
        Err(_) => Err(DynamoFailure::Other(IdempotencyError::CallDynamo {
            step,
            reason: "timed out".into(),
        })),
    }
}

async fn dynamo_bounded<T: Send, E>(
    step: &'static str,
    call: impl Future<Output = Result<T, aws_sdk_dynamodb::error::SdkError<E>>> + Send,
) -> Result<T, IdempotencyError>
where
    E: aws_sdk_dynamodb::error::ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    match dynamo_call(step, call).await {
        Ok(v) => Ok(v),
        Err(DynamoFailure::Other(e)) => Err(e),
        Err(DynamoFailure::ConditionFailed) => Err(IdempotencyError::CallDynamo {
            step,
            reason: "unexpected condition failure".into(),
        }),
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
            handler_traceparent: None,
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
