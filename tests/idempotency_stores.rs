//! #48: ONE table of the idempotency claim protocol, run on each shared store against a real server
//! started for the test run: redis (`redis-server`) and DynamoDB (moto). A row is a store-agnostic
//! fact of `worker::idempotency::Store`; where the stores differ by design (only DynamoDB keeps a
//! payload hash) the row says what each must answer, and both are asserted.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use qc::worker::idempotency::{
    Claim, DynamoSettings, DynamoStore, IdempotencyError, RedisStore, Store,
};

const MS: fn(u64) -> Duration = Duration::from_millis;
const SECS: fn(u64) -> Duration = Duration::from_secs;

#[derive(Clone, Copy, Debug)]
enum Kind {
    Redis,
    DynamoDb,
}

const KINDS: [Kind; 2] = [Kind::Redis, Kind::DynamoDb];

/// A store of `kind` on the shared test server, under a prefix of its own.
async fn store(kind: Kind) -> Store {
    store_at(kind, &common::redis_url(), &common::dynamodb_endpoint()).await
}

async fn store_at(kind: Kind, redis_url: &str, dynamodb_endpoint: &str) -> Store {
    let prefix = format!("{}:", common::unique_name("t"));
    match kind {
        Kind::Redis => Store::Redis(
            RedisStore::connect(redis_url, prefix, &qc::roots::Roots::System)
                .await
                .unwrap(),
        ),
        Kind::DynamoDb => {
            let table = common::dynamodb_table(dynamodb_endpoint, "pk").await;
            let conf = qc::aws::sdk_config(Some("us-east-1"), Some(dynamodb_endpoint)).await;
            Store::DynamoDb(DynamoStore::new(
                &conf,
                DynamoSettings {
                    table,
                    key_attribute: "pk".into(),
                    ttl_attribute: "expiresAt".into(),
                },
                prefix,
            ))
        }
    }
}

async fn acquire(s: &Store, key: &str, lease: Duration, hash: &str) -> String {
    match s.claim(key, lease, hash).await.unwrap() {
        Claim::Acquired { token } => token,
        other => panic!("{key}: expected to acquire, got {other:?}"),
    }
}

fn in_progress_for(c: &Claim) -> Option<Duration> {
    match c {
        Claim::InProgress { remaining } => *remaining,
        other => panic!("expected in progress, got {other:?}"),
    }
}

/// The claim protocol, row by row, on each store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claim_protocol_holds_on_every_shared_store() {
    for kind in KINDS {
        let s = store(kind).await;
        let lease = SECS(10);

        // An unknown key is acquired; a second claim sees it in progress, with about the lease left.
        let token = acquire(&s, "k1", lease, "h1").await;
        let left = in_progress_for(&s.claim("k1", lease, "h1").await.unwrap())
            .unwrap_or_else(|| panic!("{kind:?}: the claim's time left"));
        assert!(left <= lease && left > SECS(8), "{kind:?}: {left:?}");

        // Renewal: only the holder; never shortens.
        assert!(
            !s.renew("k1", "not-the-token", SECS(30)).await.unwrap(),
            "{kind:?}"
        );
        assert!(s.renew("k1", &token, SECS(30)).await.unwrap(), "{kind:?}");
        assert!(
            s.renew("k1", &token, SECS(1)).await.unwrap(),
            "{kind:?}: still ours"
        );
        let left = in_progress_for(&s.claim("k1", lease, "h1").await.unwrap()).unwrap();
        assert!(
            left > SECS(25),
            "{kind:?}: renewed to 30s, not shortened: {left:?}"
        );

        // Release: a stranger's token removes nothing; the holder's frees the key.
        s.abandon("k1", "not-the-token").await.unwrap();
        in_progress_for(&s.claim("k1", lease, "h1").await.unwrap());
        s.abandon("k1", &token).await.unwrap();
        let token = acquire(&s, "k1", lease, "h1").await;
        assert!(
            !s.renew("k1", "an-old-token", lease).await.unwrap(),
            "{kind:?}: released, not ours"
        );

        // Completed: done for its TTL, then gone.
        s.complete("k1", SECS(1), "h1").await.unwrap();
        assert_eq!(
            s.claim("k1", lease, "h1").await.unwrap(),
            Claim::Done,
            "{kind:?}"
        );
        assert!(
            !s.renew("k1", &token, lease).await.unwrap(),
            "{kind:?}: a done key is no claim"
        );
        tokio::time::sleep(MS(2100)).await;
        acquire(&s, "k1", lease, "h1").await;

        // An in-progress mark whose lease ran out (a crashed worker) is taken over; its old holder
        // learns it is no longer theirs and its release removes nothing.
        let old = acquire(&s, "k2", SECS(1), "h2").await;
        tokio::time::sleep(MS(1300)).await;
        let new = acquire(&s, "k2", lease, "h2").await;
        assert!(!s.renew("k2", &old, lease).await.unwrap(), "{kind:?}");
        s.abandon("k2", &old).await.unwrap();
        in_progress_for(&s.claim("k2", lease, "h2").await.unwrap());
        assert!(s.renew("k2", &new, lease).await.unwrap(), "{kind:?}");

        // A key reused for another payload: poison with a reason where the store keeps a payload
        // hash (DynamoDB), in progress and once done; redis keeps none and answers as for the same
        // payload. The same payload is a duplicate as always.
        let t3 = acquire(&s, "k3", lease, "payload-a").await;
        let other = s.claim("k3", lease, "payload-b").await.unwrap();
        if s.checks_payload() {
            match &other {
                Claim::Mismatch { reason } => {
                    assert!(
                        reason.contains("k3") && reason.contains("another payload"),
                        "{reason}"
                    );
                }
                c => panic!("{kind:?}: {c:?}"),
            }
        } else {
            in_progress_for(&other);
        }
        s.complete("k3", SECS(60), "payload-a").await.unwrap();
        let other = s.claim("k3", lease, "payload-b").await.unwrap();
        if s.checks_payload() {
            assert!(
                matches!(other, Claim::Mismatch { .. }),
                "{kind:?}: {other:?}"
            );
        } else {
            assert_eq!(other, Claim::Done, "{kind:?}");
        }
        assert_eq!(
            s.claim("k3", lease, "payload-a").await.unwrap(),
            Claim::Done
        );
        let _ = t3;
        assert_eq!(s.checks_payload(), matches!(kind, Kind::DynamoDb));
    }
}

/// One HTTP/1.1 message (head and Content-Length body) from `s`, after what `buf` holds.
async fn read_message(s: &mut tokio::net::TcpStream, buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut chunk = [0u8; 8192];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < end + len {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    Some(buf.drain(..end + len).collect())
}

/// A proxy in front of moto that lets one request at a time through: an atomic conditional write,
/// as DynamoDB guarantees. moto's threaded server checks a PutItem's condition and writes without a
/// lock: 16 boto3 threads racing `attribute_not_exists` get two winners in about 1 round of 300 on a
/// busy machine, a race of the emulator, not of the protocol this suite tests.
async fn one_at_a_time(upstream: String) -> String {
    use tokio::io::AsyncWriteExt;
    static GATE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await else {
                    return;
                };
                let (mut cbuf, mut sbuf) = (Vec::new(), Vec::new());
                while let Some(req) = read_message(&mut client, &mut cbuf).await {
                    let resp = {
                        let _one = GATE.lock().await;
                        if server.write_all(&req).await.is_err() {
                            return;
                        }
                        let Some(resp) = read_message(&mut server, &mut sbuf).await else {
                            return;
                        };
                        resp
                    };
                    if client.write_all(&resp).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    endpoint
}

/// Claims of one key at once, from several tasks: exactly one acquires, every other sees it in
/// progress (a conditional write, not a read-then-write). DynamoDB through `one_at_a_time`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_many_claims_at_once_exactly_one_acquires() {
    for kind in KINDS {
        let atomic = one_at_a_time(
            common::dynamodb_endpoint()
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .to_string(),
        )
        .await;
        let s = std::sync::Arc::new(store_at(kind, &common::redis_url(), &atomic).await);
        for round in 0..5 {
            let key = format!("race-{round}");
            let claims = futures::future::join_all((0..16).map(|_| {
                let s = s.clone();
                let key = key.clone();
                tokio::spawn(async move { s.claim(&key, SECS(30), "h").await.unwrap() })
            }))
            .await;
            let acquired = claims
                .iter()
                .filter(|c| matches!(c.as_ref().unwrap(), Claim::Acquired { .. }))
                .count();
            assert_eq!(acquired, 1, "{kind:?} round {round}: {claims:?}");
            assert!(
                claims.iter().all(|c| matches!(
                    c.as_ref().unwrap(),
                    Claim::Acquired { .. } | Claim::InProgress { .. }
                )),
                "{kind:?}: {claims:?}"
            );
        }
    }
}

/// A redis-server of this test's own, on a free port, killed when dropped.
struct OwnRedis {
    port: u16,
    child: Child,
}

impl OwnRedis {
    fn start() -> OwnRedis {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--save",
                "",
                "--bind",
                "127.0.0.1",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        let deadline = std::time::Instant::now() + SECS(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "redis did not listen");
            std::thread::sleep(MS(50));
        }
        OwnRedis { port, child }
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A store whose server is gone answers every call with an error naming the step: never Acquired,
/// never Done (either would let the worker call the handler unguarded or delete the message). The
/// worker turns that into a retry and stops receiving (tests/worker_powertools.rs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_whose_server_is_gone_answers_errors_never_a_claim() {
    for kind in KINDS {
        let mut redis = None;
        let mut moto = None;
        let s = match kind {
            Kind::Redis => {
                let r = OwnRedis::start();
                let s = store_at(kind, &format!("redis://127.0.0.1:{}", r.port), "").await;
                redis = Some(r);
                s
            }
            Kind::DynamoDb => {
                let m = common::OwnMoto::start(&[], &[]);
                let s = store_at(kind, "", &format!("http://127.0.0.1:{}", m.port)).await;
                moto = Some(m);
                s
            }
        };
        let token = acquire(&s, "k", SECS(30), "h").await;
        drop(redis.take());
        drop(moto.take());
        let started = std::time::Instant::now();
        let claimed = s.claim("k2", SECS(30), "h").await;
        assert!(
            matches!(
                claimed,
                Err(IdempotencyError::CallRedis { .. } | IdempotencyError::CallDynamo { .. })
            ),
            "{kind:?}: {claimed:?}"
        );
        assert!(started.elapsed() < SECS(30), "{kind:?}: bounded");
        assert!(s.renew("k", &token, SECS(30)).await.is_err(), "{kind:?}");
        assert!(s.complete("k", SECS(30), "h").await.is_err(), "{kind:?}");
        assert!(s.ping().await.is_err(), "{kind:?}");
    }
}
