//! Telemetry shared by both binaries: tracing logs (JSON by default), lock-free Prometheus metrics
//! rendered as text exposition, and a tiny HTTP server for `/metrics`, `/healthz` and `/readyz`.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::UnsyncBoxBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use tokio::net::TcpListener;

pub mod otlp;

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot install the log subscriber: {0}")]
    InstallLogger(String),
    #[error(
        "cannot listen on {addr} for metrics and probes: {source} (set --metrics-addr to a free address)"
    )]
    BindProbes {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// Log line format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Json,
    Text,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "json" => Ok(LogFormat::Json),
            "text" => Ok(LogFormat::Text),
            other => Err(format!("invalid log format {other:?}: use json or text")),
        }
    }
}

/// Installs the global tracing subscriber; the level comes from `RUST_LOG` (default `info`).
pub fn init_logging(format: LogFormat) -> Result<(), TelemetryError> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
    result.map_err(|e| TelemetryError::InstallLogger(e.to_string()))
}

/// A monotonically increasing count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Debug, Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn dec(&self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A histogram with fixed upper bounds (seconds or any unit); observing is two atomic adds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    buckets: Vec<AtomicU64>,
    count: AtomicU64,
    /// Sum in microunits, so it stays an integer atomic.
    sum_micros: AtomicU64,
}

/// Latency buckets in seconds, from 5 ms to 12 h (the SQS visibility maximum). Neighbours are at most
/// 1.5 apart up to 1 min, so a P99 interpolated inside a bucket is fine enough for the controller's
/// 20 % rule (`ProcessingTimeWithinDeclared`).
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.0075, 0.01, 0.015, 0.025, 0.035, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.35, 0.5, 0.75,
    1.0, 1.5, 2.0, 2.5, 3.5, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 90.0, 120.0, 180.0,
    300.0, 600.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 43200.0,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            buckets: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: f64) {
        // Buckets are stored non-cumulatively and summed when rendered: one increment per observation.
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = (value.max(0.0) * 1e6) as u64;
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }
}

/// Builds a Prometheus text exposition (version 0.0.4).
#[derive(Default)]
pub struct Exposition {
    out: String,
}

/// Label pairs of one sample.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Exposition {
    pub fn new() -> Self {
        Self::default()
    }

    /// A gauge family's HELP and TYPE lines, for samples written one by one ([`Exposition::sample`]).
    pub fn gauge_header(&mut self, name: &str, help: &str) {
        self.header(name, help, "gauge");
    }

    fn header(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    /// One sample line.
    pub fn sample(&mut self, name: &str, labels: Labels<'_>, value: impl std::fmt::Display) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A counter family: `samples` are (labels, value); the name should end in `_total`.
    pub fn counter(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, u64)]) {
        self.header(name, help, "counter");
        for (labels, v) in samples {
            self.sample(name, labels, v);
        }
    }

    /// A counter family with fractional values (seconds).
    pub fn counter_f64(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, f64)]) {
        self.header(name, help, "counter");
        for (labels, v) in samples {
            self.sample(name, labels, v);
        }
    }

    pub fn gauge(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, i64)]) {
        self.header(name, help, "gauge");
        for (labels, v) in samples {
            self.sample(name, labels, v);
        }
    }

    /// A gauge family with fractional values (seconds, rates).
    pub fn gauge_f64(&mut self, name: &str, help: &str, samples: &[(Labels<'_>, f64)]) {
        self.header(name, help, "gauge");
        for (labels, v) in samples {
            self.sample(name, labels, v);
        }
    }

    pub fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.header(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0u64;
        for (i, bound) in h.bounds.iter().enumerate() {
            cumulative += h.buckets[i].load(Ordering::Relaxed);
            let le = bound.to_string();
            self.sample(&bucket, &[("le", &le)], cumulative);
        }
        let count = h.count.load(Ordering::Relaxed);
        self.sample(&bucket, &[("le", "+Inf")], count);
        let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        self.sample(&format!("{name}_sum"), &[], sum);
        self.sample(&format!("{name}_count"), &[], count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn escape_label(v: &str) -> std::borrow::Cow<'_, str> {
    if v.contains(['\\', '"', '\n']) {
        v.replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
            .into()
    } else {
        v.into()
    }
}

/// What `/metrics` answers: `head` at once, then each part of `rest`, rendered only when the client has
/// taken the one before. A controller with thousands of QueueConsumers exposes tens of megabytes of
/// per-consumer series; rendered whole, each scrape would hold all of it (and the map it came from) in
/// memory at once.
pub struct MetricsBody {
    pub head: String,
    pub rest: Option<Box<dyn Iterator<Item = String> + Send>>,
}

impl From<String> for MetricsBody {
    fn from(head: String) -> Self {
        MetricsBody { head, rest: None }
    }
}

/// What the probe server asks its owner.
pub trait Probes: Send + Sync + 'static {
    /// Prometheus text for `/metrics`.
    fn metrics(&self) -> MetricsBody;
    /// `/healthz`: Ok while the process is able to do its job; Err(reason) to be restarted.
    fn live(&self) -> Result<(), String>;
    /// `/readyz`: Ok when serving; Err(reason) otherwise.
    fn ready(&self) -> Result<(), String>;
}

/// Binds `addr` for the probe server (separate from `serve` so a bad address fails at start).
pub async fn bind_probes(addr: &str) -> Result<TcpListener, TelemetryError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| TelemetryError::BindProbes {
            addr: addr.to_string(),
            source,
        })
}

/// Serves `/metrics`, `/healthz` and `/readyz` until `shutdown` completes.
pub async fn serve_probes(
    listener: TcpListener,
    probes: Arc<dyn Probes>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "probe server accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let probes = probes.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let probes = probes.clone();
                async move { Ok::<_, Infallible>(route(&*probes, req.uri().path())) }
            });
            let io = hyper_util::rt::TokioIo::new(stream);
            // One request per connection: probes and scrapes open one each, and no idle
            // connection keeps a task alive.
            let _ = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .serve_connection(io, service)
                .await;
        });
    }
}

type Body = UnsyncBoxBody<Bytes, Infallible>;

fn route(probes: &dyn Probes, path: &str) -> Response<Body> {
    let (status, content_type, body) = match path {
        "/metrics" => {
            let MetricsBody { head, rest } = probes.metrics();
            let body = match rest {
                None => Full::new(Bytes::from(head)).boxed_unsync(),
                // Each part is rendered when hyper polls for more, i.e. once the previous one is
                // written out: memory holds a part, not the exposition. Empty parts are skipped (an
                // empty chunk would read as the end of a chunked body).
                Some(rest) => StreamBody::new(futures::stream::iter(
                    std::iter::once(head)
                        .chain(rest)
                        .filter(|part| !part.is_empty())
                        .map(|part| Ok::<_, Infallible>(Frame::data(Bytes::from(part)))),
                ))
                .boxed_unsync(),
            };
            return with_content_type(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                body,
            );
        }
        "/healthz" => probe(probes.live()),
        "/readyz" => probe(probes.ready()),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics, /healthz or /readyz\n".to_string(),
        ),
    };
    with_content_type(
        status,
        content_type,
        Full::new(Bytes::from(body)).boxed_unsync(),
    )
}

fn with_content_type(status: StatusCode, content_type: &str, body: Body) -> Response<Body> {
    let mut resp = Response::new(body);
    *resp.status_mut() = status;
    if let Ok(v) = hyper::header::HeaderValue::from_str(content_type) {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp
}

/// A probe's answer: 200 `ok`, or 503 with the reason it fails.
fn probe(result: Result<(), String>) -> (StatusCode, &'static str, String) {
    match result {
        Ok(()) => (StatusCode::OK, "text/plain", "ok\n".to_string()),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "text/plain",
            format!("{reason}\n"),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `/metrics` of many parts, counting the parts rendered.
    struct Parts {
        rendered: Arc<AtomicU64>,
        count: u64,
        size: usize,
    }

    impl Probes for Parts {
        fn metrics(&self) -> MetricsBody {
            let rendered = self.rendered.clone();
            let (count, size) = (self.count, self.size);
            MetricsBody {
                head: "# head\n".into(),
                rest: Some(Box::new((0..count).map(move |i| {
                    rendered.fetch_add(1, Ordering::SeqCst);
                    let mut part = format!("part_{i} ");
                    part.push_str(&"x".repeat(size - part.len() - 1));
                    part.push('\n');
                    part
                }))),
            }
        }
        fn live(&self) -> Result<(), String> {
            Ok(())
        }
        fn ready(&self) -> Result<(), String> {
            Ok(())
        }
    }

    /// The parts of `/metrics` are rendered as the client reads them: a client that reads nothing
    /// holds back all but the few parts the socket's buffers take, and one that reads gets every part,
    /// in order, whole.
    #[tokio::test]
    async fn metrics_parts_are_rendered_as_the_client_reads() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (count, size) = (1000u64, 64 * 1024);
        let rendered = Arc::new(AtomicU64::new(0));
        let listener = bind_probes("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let probes = Arc::new(Parts {
            rendered: rendered.clone(),
            count,
            size,
        });
        tokio::spawn(serve_probes(listener, probes, std::future::pending()));
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        conn.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // Not reading: the server renders until the socket's buffers are full, and then waits.
        let mut last = u64::MAX;
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let now = rendered.load(Ordering::SeqCst);
            if now == last {
                break;
            }
            last = now;
        }
        assert!(
            last < count / 2,
            "{last} of {count} parts rendered before the client read any"
        );
        let mut raw = Vec::new();
        conn.read_to_end(&mut raw).await.unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, mut body) = raw.split_once("\r\n\r\n").unwrap();
        assert!(
            head.to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{head}"
        );
        let mut text = String::new();
        loop {
            let (len, rest) = body.split_once("\r\n").unwrap();
            let len = usize::from_str_radix(len, 16).unwrap();
            if len == 0 {
                break;
            }
            text.push_str(&rest[..len]);
            body = &rest[len + 2..];
        }
        assert_eq!(rendered.load(Ordering::SeqCst), count);
        assert_eq!(text.len(), "# head\n".len() + count as usize * size);
        let parts: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(parts.len(), count as usize);
        for (i, part) in parts.iter().enumerate() {
            assert!(
                part.starts_with(&format!("part_{i} ")),
                "part {i}: {}",
                &part[..20]
            );
        }
    }

    #[test]
    fn histogram_renders_cumulative_buckets() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.5);
        h.observe(5.0);
        let mut e = Exposition::new();
        e.histogram("qc_x_seconds", "x", &h);
        let text = e.finish();
        assert!(
            text.contains("qc_x_seconds_bucket{le=\"0.1\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("qc_x_seconds_bucket{le=\"1\"} 2\n"), "{text}");
        assert!(
            text.contains("qc_x_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("qc_x_seconds_count 3\n"), "{text}");
        assert!(text.contains("qc_x_seconds_sum 5.55\n"), "{text}");
    }

    #[test]
    fn counters_escape_labels() {
        let mut e = Exposition::new();
        e.counter("qc_y_total", "y", &[(&[("a", "q\"x")], 2)]);
        let text = e.finish();
        assert!(text.contains("# TYPE qc_y_total counter\n"));
        assert!(text.contains("qc_y_total{a=\"q\\\"x\"} 2\n"), "{text}");
    }
}
