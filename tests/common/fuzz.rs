//! The fuzz harness of `tests/fuzz.rs` (#29): each target replays its kept cases from
//! `tests/data/fuzz/<target>/` first, then runs proptest for a bounded budget. A failure is shrunk to
//! a minimal input and written there as a new case (commit it: it is replayed on every run after).
//!
//! Budget: `QC_FUZZ_CASES` cases per target (default 64, what `cargo test` runs in CI), or, with
//! `QC_FUZZ_SECONDS`, rounds of that many cases until the seconds are spent (`scripts/fuzz`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Cases per target and round when `QC_FUZZ_CASES` is not set: small, `cargo test` runs every target.
pub const DEFAULT_CASES: u32 = 64;

/// Where a target's kept cases live.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/fuzz")
        .join(target)
}

fn cases() -> u32 {
    std::env::var("QC_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_CASES)
}

fn seconds() -> Option<Duration> {
    std::env::var("QC_FUZZ_SECONDS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|s| *s > 0)
        .map(Duration::from_secs)
}

/// A kept case as written to the corpus: the input and what was wrong with it when it was found.
#[derive(Serialize, serde::Deserialize)]
struct Kept<T> {
    found: String,
    input: T,
}

/// The kept inputs of `target` (file name, input); a file that does not parse as this target's input
/// fails the test (the input's shape changed: rewrite the case).
pub fn kept<T: DeserializeOwned>(target: &str) -> Vec<(String, T)> {
    let dir = corpus_dir(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let kept: Kept<T> = serde_json::from_str(&text).unwrap_or_else(|e| {
                panic!("{}: not an input of fuzz target {target}: {e}", p.display())
            });
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                kept.input,
            )
        })
        .collect()
}

fn save<T: Serialize>(target: &str, found: &str, input: &T) -> PathBuf {
    let json = serde_json::to_string_pretty(&Kept {
        found: found.to_string(),
        input,
    })
    .unwrap();
    // FNV-1a of the input: the same minimal case found twice is one file.
    let hash = json.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("crash-{hash:016x}.json"));
    std::fs::write(&path, json + "\n").unwrap();
    path
}

/// Replays `target`'s kept cases, then runs `property` on inputs from `strategy` within the budget.
pub fn fuzz<S>(target: &str, strategy: S, property: impl Fn(&S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Serialize + DeserializeOwned,
{
    for (file, input) in kept::<S::Value>(target) {
        let outcome = catch_unwind(AssertUnwindSafe(|| property(&input)));
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                panic!("fuzz target {target}: kept case {file} fails again: {e}\n{input:?}")
            }
            Err(panic) => panic!(
                "fuzz target {target}: kept case {file} panics again ({})\n{input:?}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("?")
            ),
        }
    }
    let deadline = seconds().map(|s| Instant::now() + s);
    let mut rounds = 0u64;
    loop {
        let mut runner = TestRunner::new(Config {
            cases: cases(),
            // The corpus above is this harness' persistence.
            failure_persistence: None,
            ..Config::default()
        });
        match runner.run(&strategy, |v| property(&v)) {
            Ok(()) => {}
            Err(TestError::Fail(reason, input)) => {
                let path = save(target, &reason.to_string(), &input);
                panic!(
                    "fuzz target {target}: {reason}\nminimal input: {input:?}\nkept as {} (commit it: it is replayed on every run)",
                    path.display()
                );
            }
            Err(TestError::Abort(reason)) => panic!("fuzz target {target}: aborted: {reason}"),
        }
        rounds += 1;
        if deadline.is_none_or(|d| Instant::now() >= d) {
            break;
        }
    }
    if deadline.is_some() {
        eprintln!(
            "fuzz target {target}: {} cases without a failure",
            rounds * u64::from(cases())
        );
    }
}

/// Sends one request through a fresh pool of the worker's HTTP/1.1 client to a server that answers
/// with `answer` and closes; the answer as the client read it, or its error.
pub async fn exchange(answer: Vec<u8>) -> Result<qc::worker::http1::Answer, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let authority = listener.local_addr().unwrap().to_string();
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        let mut b = [0u8; 1024];
        while !req.ends_with(b"end") {
            match s.read(&mut b).await {
                Ok(0) | Err(_) => return,
                Ok(n) => req.extend_from_slice(&b[..n]),
            }
        }
        let _ = s.write_all(&answer).await;
        let _ = s.shutdown().await;
    });
    let pool = qc::worker::http1::Pool::new(
        authority.clone(),
        1,
        Duration::from_secs(5),
        Duration::from_secs(5),
    );
    let head = format!("POST / HTTP/1.1\r\nhost: {authority}\r\ncontent-length: 3\r\n\r\n");
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        pool.send(head.as_bytes(), b"end", true),
    )
    .await
    .map_err(|_| "no result within 10s".to_string())?
    .map_err(|e| e.to_string());
    let _ = server.await;
    out
}

pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
