//! The user's handler, behind one call: HTTP (CloudEvents binary mode) or exec (body on stdin).
//! The status-code and exit-code mappings of docs/handler-contract.md are pure functions, tested by
//! table.

mod batch;
mod exec;
mod http;

use std::time::{Duration, SystemTime};

pub use batch::{
    ANSWER_FILE_ENV, Answer, AnswerFile, BATCH_CONTENT_TYPE, BatchVerdict, answered, parse_answer,
};
pub use exec::ExecHandler;
pub use http::{CE_TYPE, DEFAULT_MAX_HEAD, HttpHandler, OMITTED_HEADER};

use super::sqs::Message;

/// What the handler said about one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Success,
    /// Can never succeed (HTTP 400/422, exit 65).
    Poison(String),
    /// May succeed later; `retry_after` overrides the backoff (HTTP 429/503 with Retry-After).
    Transient {
        reason: String,
        retry_after: Option<Duration>,
        cause: Cause,
    },
    /// The handler could not be reached at all (connection refused): the worker pauses receiving.
    Unreachable(String),
}

/// What a transient failure says about the handler's dependency, for the outage breaker
/// (`worker::breaker`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Points at a dependency: no answer, a timeout, HTTP 5xx or 429, an exec exit other than 0/65/75
    /// or a signal. Counted by the breaker.
    Downstream,
    /// The handler said its dependency is unavailable: HTTP 503 with Retry-After, exit 75
    /// (EX_TEMPFAIL). Opens the breaker at once.
    Unavailable,
    /// Says nothing of the dependency (another 4xx, a 1xx or 3xx answer): retried, not counted.
    Other,
}

/// Why a handler could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    #[error(
        "--http-url {url:?} is not a usable URL: {reason} (expected http://127.0.0.1:8080/messages)"
    )]
    ParseHttpUrl { url: String, reason: String },
    #[error("--exec needs a command after `--`, e.g. `--exec -- /app/handle`")]
    EmptyCommand,
    #[error("--exec command {command:?} was not found or is not executable: {reason}")]
    FindCommand { command: String, reason: String },
}

/// Queue-level facts handed to every handler call.
#[derive(Clone, Debug, Default)]
pub struct QueueContext {
    pub url: String,
    pub arn: String,
}

pub enum Handler {
    Http(Box<HttpHandler>),
    Exec(ExecHandler),
}

impl Handler {
    /// Calls the handler; None if it was still running at `deadline`. Returns only once the call has
    /// really stopped: the HTTP request's connection closed, the exec process group killed and its
    /// leader reaped (an idempotency claim is held until then).
    pub async fn handle(&self, msg: &Message, deadline: tokio::time::Instant) -> Option<Verdict> {
        match self {
            // Dropping the request future at the deadline closes its connection.
            Handler::Http(h) => tokio::time::timeout_at(deadline, h.handle(msg)).await.ok(),
            Handler::Exec(h) => h.handle(msg, deadline).await,
        }
    }

    /// Batch mode: one call for all of `msgs`; None if it was still running at `deadline` (stopped
    /// as `handle` stops a call).
    pub async fn handle_batch(
        &self,
        msgs: &[&Message],
        deadline: tokio::time::Instant,
    ) -> Option<BatchVerdict> {
        match self {
            Handler::Http(h) => tokio::time::timeout_at(deadline, h.handle_batch(msgs))
                .await
                .ok(),
            Handler::Exec(h) => h.handle_batch(msgs, deadline).await,
        }
    }

    /// Waits until the handler can take a request (the HTTP port accepts connections).
    pub async fn wait_reachable(&self) {
        if let Handler::Http(h) = self {
            h.wait_reachable().await;
        }
    }

    /// Sets the queue ARN once it is known (the handler is built before the queue is read, so a bad
    /// handler flag fails at once instead of after SQS answers).
    pub fn set_queue_arn(&mut self, arn: &str) {
        match self {
            Handler::Http(h) => h.set_queue_arn(arn),
            Handler::Exec(h) => h.set_queue_arn(arn),
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Handler::Http(h) => format!("http {}", h.url()),
            Handler::Exec(h) => format!("exec {:?}", h.command()),
        }
    }
}

/// The HTTP mapping (docs/handler-contract.md): 2xx success; 400/422 poison; 429/503 transient after Retry-After if given;
/// anything else transient with the normal backoff.
pub fn verdict_for_status(status: u16, retry_after: Option<&str>, now: SystemTime) -> Verdict {
    match status {
        200..=299 => Verdict::Success,
        400 | 422 => Verdict::Poison(format!("handler answered HTTP {status}")),
        429 | 503 => {
            let retry_after = retry_after.and_then(|v| parse_retry_after(v, now));
            Verdict::Transient {
                reason: format!("handler answered HTTP {status}"),
                cause: if status == 503 && retry_after.is_some() {
                    Cause::Unavailable
                } else {
                    Cause::Downstream
                },
                retry_after,
            }
        }
        500..=599 => Verdict::Transient {
            reason: format!("handler answered HTTP {status}"),
            retry_after: None,
            cause: Cause::Downstream,
        },
        _ => Verdict::Transient {
            reason: format!("handler answered HTTP {status}"),
            retry_after: None,
            cause: Cause::Other,
        },
    }
}

/// Retry-After as delay-seconds or an HTTP date.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// EX_DATAERR from sysexits.h: the input data was incorrect.
pub const EXIT_POISON: i32 = 65;
/// EX_TEMPFAIL from sysexits.h: a temporary failure; for the worker, the handler's dependency is
/// unavailable (the outage breaker opens at once).
pub const EXIT_UNAVAILABLE: i32 = 75;

/// The exec mapping (docs/handler-contract.md): exit 0 success, 65 poison, any other exit or a signal transient.
pub fn verdict_for_exit(code: Option<i32>, signal: Option<i32>) -> Verdict {
    match (code, signal) {
        (Some(0), _) => Verdict::Success,
        (Some(EXIT_POISON), _) => Verdict::Poison(format!("handler exited {EXIT_POISON}")),
        (Some(EXIT_UNAVAILABLE), _) => Verdict::Transient {
            reason: format!(
                "handler exited {EXIT_UNAVAILABLE} (EX_TEMPFAIL: its dependency is unavailable)"
            ),
            retry_after: None,
            cause: Cause::Unavailable,
        },
        (Some(c), _) => Verdict::Transient {
            reason: format!("handler exited {c}"),
            retry_after: None,
            cause: Cause::Downstream,
        },
        (None, Some(s)) => Verdict::Transient {
            reason: format!("handler killed by signal {s}"),
            retry_after: None,
            cause: Cause::Downstream,
        },
        (None, None) => Verdict::Transient {
            reason: "handler ended without an exit code".into(),
            retry_after: None,
            cause: Cause::Downstream,
        },
    }
}

/// RFC 3339 UTC time of a millisecond epoch timestamp (for `ce-time`), always with three fraction
/// digits. None past jiff's range (its last instant is in 9999-12-30), which no SQS SentTimestamp
/// reaches; the header is then left out.
pub fn rfc3339_millis(epoch_ms: u64) -> Option<String> {
    let ts = jiff::Timestamp::from_millisecond(i64::try_from(epoch_ms).ok()?).ok()?;
    Some(format!("{ts:.3}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// None: not transient; Some(retry_after).
    #[allow(clippy::option_option)]
    fn transient(v: &Verdict) -> Option<Option<Duration>> {
        match v {
            Verdict::Transient { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    fn cause(v: &Verdict) -> Option<Cause> {
        match v {
            Verdict::Transient { cause, .. } => Some(*cause),
            _ => None,
        }
    }

    #[test]
    fn what_a_failure_says_about_the_dependency() {
        let now = SystemTime::UNIX_EPOCH;
        for s in [500, 502, 504, 599, 429] {
            assert_eq!(
                cause(&verdict_for_status(s, None, now)),
                Some(Cause::Downstream),
                "{s}"
            );
        }
        assert_eq!(
            cause(&verdict_for_status(429, Some("5"), now)),
            Some(Cause::Downstream)
        );
        assert_eq!(
            cause(&verdict_for_status(503, None, now)),
            Some(Cause::Downstream)
        );
        assert_eq!(
            cause(&verdict_for_status(503, Some("5"), now)),
            Some(Cause::Unavailable)
        );
        for s in [300, 401, 403, 404, 409, 413] {
            assert_eq!(
                cause(&verdict_for_status(s, None, now)),
                Some(Cause::Other),
                "{s}"
            );
        }
        assert_eq!(cause(&verdict_for_status(400, None, now)), None);
        assert_eq!(
            cause(&verdict_for_exit(Some(75), None)),
            Some(Cause::Unavailable)
        );
        for c in [1, 2, 64, 66, 127, 255] {
            assert_eq!(
                cause(&verdict_for_exit(Some(c), None)),
                Some(Cause::Downstream)
            );
        }
        assert_eq!(
            cause(&verdict_for_exit(None, Some(9))),
            Some(Cause::Downstream)
        );
    }

    #[test]
    fn http_status_mapping() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        for s in [200, 201, 204, 299] {
            assert_eq!(verdict_for_status(s, None, now), Verdict::Success, "{s}");
        }
        for s in [400, 422] {
            assert!(
                matches!(verdict_for_status(s, None, now), Verdict::Poison(_)),
                "{s}"
            );
        }
        for s in [300, 401, 403, 404, 409, 500, 502, 504] {
            assert_eq!(
                transient(&verdict_for_status(s, Some("7"), now)),
                Some(None),
                "{s}"
            );
        }
        for s in [429, 503] {
            assert_eq!(
                transient(&verdict_for_status(s, Some("7"), now)),
                Some(Some(Duration::from_secs(7)))
            );
            assert_eq!(transient(&verdict_for_status(s, None, now)), Some(None));
            assert_eq!(
                transient(&verdict_for_status(s, Some("soon"), now)),
                Some(None)
            );
        }
    }

    #[test]
    fn retry_after_accepts_http_dates() {
        let now = httpdate::parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:50:37 GMT", now),
            Some(Duration::from_mins(1))
        );
        assert_eq!(
            parse_retry_after("Sun, 06 Nov 1994 08:00:00 GMT", now),
            Some(Duration::ZERO)
        );
    }

    #[test]
    fn exit_code_mapping() {
        assert_eq!(verdict_for_exit(Some(0), None), Verdict::Success);
        assert!(matches!(
            verdict_for_exit(Some(65), None),
            Verdict::Poison(_)
        ));
        for c in [1, 2, 64, 66, 75, 127, 255] {
            assert_eq!(
                transient(&verdict_for_exit(Some(c), None)),
                Some(None),
                "{c}"
            );
        }
        assert_eq!(transient(&verdict_for_exit(None, Some(9))), Some(None));
    }

    #[test]
    fn rfc3339_of_epoch_millis() {
        for (ms, text) in [
            (0, "1970-01-01T00:00:00.000Z"),
            (100, "1970-01-01T00:00:00.100Z"),
            (951_782_400_123, "2000-02-29T00:00:00.123Z"),
            (951_868_800_000, "2000-03-01T00:00:00.000Z"),
            (1_767_225_599_999, "2025-12-31T23:59:59.999Z"),
            (1_709_164_799_001, "2024-02-28T23:59:59.001Z"),
            (4_107_456_000_000, "2100-02-28T00:00:00.000Z"),
            (4_107_542_400_000, "2100-03-01T00:00:00.000Z"),
            (253_402_207_199_999, "9999-12-30T21:59:59.999Z"),
        ] {
            assert_eq!(rfc3339_millis(ms).as_deref(), Some(text), "{ms}");
        }
        assert_eq!(rfc3339_millis(253_402_300_800_000), None);
        assert_eq!(rfc3339_millis(u64::MAX), None);
    }
}
