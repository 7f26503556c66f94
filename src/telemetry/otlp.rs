//! Spans exported over OTLP/HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` is set, for both
//! binaries: the standard variables read once at start (a pure parse), and the SDK's batch pipeline.
//!
//! Off (no endpoint): nothing is built, and callers hold no tracer, so no span is made anywhere.
//! The export goes through the hyper client already in the tree (`Client`), not a second HTTP
//! client: plain `http://` endpoints (a collector beside the pod or in the cluster).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{SpanId, TraceId};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SdkTracer, SdkTracerProvider,
};

/// The exporter's answer is read up to this size (an OTLP answer is a few bytes).
const MAX_ANSWER: usize = 64 * 1024;
/// An export that takes longer is given up (`OTEL_EXPORTER_OTLP_TIMEOUT` when set).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// At shutdown, the last export is waited for this long at most (a pod's grace period is short).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);

/// Why tracing cannot start: each names the variable and the fix.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OtlpError {
    #[error(
        "{var}={value:?} is not an OTLP/HTTP endpoint: {why} (give the collector's base URL, e.g. http://otel-collector.observability:4318, or unset it to turn tracing off)"
    )]
    Endpoint {
        var: &'static str,
        value: String,
        why: &'static str,
    },
    #[error(
        "OTEL_TRACES_SAMPLER={0:?} is not a sampler this build knows: use parentbased_traceidratio (with OTEL_TRACES_SAMPLER_ARG), traceidratio, parentbased_always_on, parentbased_always_off, always_on or always_off"
    )]
    Sampler(String),
    #[error(
        "OTEL_TRACES_SAMPLER_ARG={0:?} is not a ratio: give a number from 0 to 1 (0.01 samples 1 % of traces)"
    )]
    SamplerArg(String),
    #[error("OTEL_EXPORTER_OTLP_TIMEOUT={0:?} is not a number of milliseconds (e.g. 10000)")]
    Timeout(String),
    #[error("cannot build the OTLP exporter: {0}")]
    Build(String),
}

/// Which traces are kept (`OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Sampling {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
    /// A span with a parent (the producer's context) follows the parent's decision; a root span
    /// follows the inner choice.
    ParentBased(Root),
}

/// The decision for a root span under `Sampling::ParentBased`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Root {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
}

impl Sampling {
    fn sampler(self) -> Sampler {
        let root = |r: Root| match r {
            Root::AlwaysOn => Sampler::AlwaysOn,
            Root::AlwaysOff => Sampler::AlwaysOff,
            Root::Ratio(x) => Sampler::TraceIdRatioBased(x),
        };
        match self {
            Sampling::AlwaysOn => Sampler::AlwaysOn,
            Sampling::AlwaysOff => Sampler::AlwaysOff,
            Sampling::Ratio(x) => Sampler::TraceIdRatioBased(x),
            Sampling::ParentBased(r) => Sampler::ParentBased(Box::new(root(r))),
        }
    }
}

/// What the environment asks for when tracing is on.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// The full URL spans are POSTed to (`…/v1/traces`).
    pub traces_url: String,
    pub sampling: Sampling,
    /// `OTEL_SERVICE_NAME`, else the binary's name.
    pub service_name: String,
    pub timeout: Duration,
}

/// Tracing settings from the standard variables (`var` looks one up); None when tracing is off:
/// no `OTEL_EXPORTER_OTLP_ENDPOINT` (nor `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), or `OTEL_SDK_DISABLED=true`,
/// or `OTEL_TRACES_EXPORTER=none`.
pub fn settings(
    var: impl Fn(&str) -> Option<String>,
    service: &str,
) -> Result<Option<Settings>, OtlpError> {
    let set = |name: &str| {
        var(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return Ok(None);
    }
    let traces_url = if let Some(url) = set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        // The signal's own endpoint is used as is (the OTLP exporter specification).
        check_endpoint("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &url)?;
        url
    } else if let Some(base) = set("OTEL_EXPORTER_OTLP_ENDPOINT") {
        check_endpoint("OTEL_EXPORTER_OTLP_ENDPOINT", &base)?;
        format!("{}/v1/traces", base.trim_end_matches('/'))
    } else {
        return Ok(None);
    };
    let arg = set("OTEL_TRACES_SAMPLER_ARG");
    let ratio = || -> Result<f64, OtlpError> {
        match &arg {
            // The specification's default ratio.
            None => Ok(1.0),
            Some(a) => a
                .parse::<f64>()
                .ok()
                .filter(|x| (0.0..=1.0).contains(x))
                .ok_or_else(|| OtlpError::SamplerArg(a.clone())),
        }
    };
    let sampling = match set("OTEL_TRACES_SAMPLER").as_deref() {
        None | Some("parentbased_always_on") => Sampling::ParentBased(Root::AlwaysOn),
        Some("parentbased_always_off") => Sampling::ParentBased(Root::AlwaysOff),
        Some("parentbased_traceidratio") => Sampling::ParentBased(Root::Ratio(ratio()?)),
        Some("traceidratio") => Sampling::Ratio(ratio()?),
        Some("always_on") => Sampling::AlwaysOn,
        Some("always_off") => Sampling::AlwaysOff,
        Some(other) => return Err(OtlpError::Sampler(other.to_string())),
    };
    let timeout = match set("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT")
        .or_else(|| set("OTEL_EXPORTER_OTLP_TIMEOUT"))
    {
        None => EXPORT_TIMEOUT,
        Some(ms) => Duration::from_millis(ms.parse().map_err(|_| OtlpError::Timeout(ms.clone()))?),
    };
    Ok(Some(Settings {
        traces_url,
        sampling,
        service_name: set("OTEL_SERVICE_NAME").unwrap_or_else(|| service.to_string()),
        timeout,
    }))
}

fn check_endpoint(var: &'static str, url: &str) -> Result<(), OtlpError> {
    let err = |why| OtlpError::Endpoint {
        var,
        value: url.to_string(),
        why,
    };
    let uri: http::Uri = url.parse().map_err(|_| err("not a URL"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(err(
                "https is not supported by this build's exporter; send to a collector over http (in the pod or the cluster) and let it forward over TLS",
            ));
        }
        _ => return Err(err("it must start with http://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(err("it names no host"));
    }
    Ok(())
}

/// The running pipeline: a tracer for spans, flushed and stopped by `shutdown`.
pub struct Otlp {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    settings: Settings,
}

impl Otlp {
    /// From the process environment; None when tracing is off. Called inside the Tokio runtime:
    /// exports run on it.
    pub fn from_env(service: &str) -> Result<Option<Otlp>, OtlpError> {
        match settings(|name| std::env::var(name).ok(), service)? {
            None => Ok(None),
            Some(s) => Otlp::start(s).map(Some),
        }
    }

    /// Starts the batch pipeline sending to `settings.traces_url` (inside the Tokio runtime).
    pub fn start(settings: Settings) -> Result<Otlp, OtlpError> {
        let client = Client::new(tokio::runtime::Handle::current(), settings.timeout);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(settings.traces_url.clone())
            .with_timeout(settings.timeout)
            .with_http_client(client)
            .build()
            .map_err(|e| OtlpError::Build(e.to_string()))?;
        let mut resource = opentelemetry_sdk::Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(settings.service_name.clone());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(settings.sampling.sampler())
            .with_id_generator(Ids::default())
            .with_resource(resource.build())
            .build();
        let tracer = provider.tracer(settings.service_name.clone());
        Ok(Otlp {
            provider,
            tracer,
            settings,
        })
    }

    pub fn tracer(&self) -> SdkTracer {
        self.tracer.clone()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Exports what is still buffered and stops. The SDK's batch thread blocks on the export, which
    /// runs on the runtime: so the wait happens on a blocking thread while the runtime goes on.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(SHUTDOWN_WAIT))
                .await;
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "spans still buffered could not all be exported");
            }
            Err(e) => tracing::warn!(error = %e, "the span exporter did not stop cleanly"),
        }
    }
}

thread_local! {
    /// The trace id the next root span started on this thread gets (`with_trace_id`).
    static NEXT_TRACE_ID: std::cell::Cell<Option<TraceId>> = const { std::cell::Cell::new(None) };
}

/// Runs `start` (which starts one root span, synchronously) with `id` as the trace id a root span
/// gets: the worker gives every delivery of a message the trace id of its message id, so all
/// deliveries of a message share one trace and one sampling decision. A span with a parent keeps
/// the parent's trace id, as always.
pub fn with_trace_id<T>(id: TraceId, start: impl FnOnce() -> T) -> T {
    NEXT_TRACE_ID.with(|n| n.set(Some(id)));
    let out = start();
    NEXT_TRACE_ID.with(|n| n.set(None));
    out
}

/// The SDK's random ids, except a root span's trace id set by `with_trace_id`.
#[derive(Debug, Default)]
struct Ids(RandomIdGenerator);

impl IdGenerator for Ids {
    fn new_trace_id(&self) -> TraceId {
        match NEXT_TRACE_ID.with(std::cell::Cell::take) {
            Some(id) if id != TraceId::INVALID => id,
            _ => self.0.new_trace_id(),
        }
    }

    fn new_span_id(&self) -> SpanId {
        self.0.new_span_id()
    }
}

/// The exporter's HTTP client: hyper's, each request run as a task on the runtime (the SDK calls it
/// from its own batch thread), bounded by the export timeout.
#[derive(Clone, Debug)]
struct Client {
    inner: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
    runtime: tokio::runtime::Handle,
    timeout: Duration,
}

impl Client {
    fn new(runtime: tokio::runtime::Handle, timeout: Duration) -> Client {
        let inner =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        Client {
            inner,
            runtime,
            timeout,
        }
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, opentelemetry_http::HttpError> {
        let (parts, body) = request.into_parts();
        let request = http::Request::from_parts(parts, Full::new(body));
        let client = self.inner.clone();
        let timeout = self.timeout;
        let task = self.runtime.spawn(async move {
            let call = async {
                let answer = client.request(request).await?;
                let (parts, body) = answer.into_parts();
                let body = Limited::new(body, MAX_ANSWER).collect().await?.to_bytes();
                Ok::<_, opentelemetry_http::HttpError>(http::Response::from_parts(parts, body))
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(r) => r,
                Err(_) => Err(format!("no answer within {} ms", timeout.as_millis()).into()),
            }
        });
        task.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> Result<Option<Settings>, OtlpError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect();
        settings(
            |name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            "qc-worker",
        )
    }

    #[test]
    fn no_endpoint_means_off() {
        assert_eq!(parse(&[]), Ok(None));
        assert_eq!(parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]), Ok(None));
        assert_eq!(
            parse(&[("OTEL_TRACES_SAMPLER", "always_on")]),
            Ok(None),
            "a sampler alone turns nothing on"
        );
        let e = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        assert_eq!(parse(&[e, ("OTEL_SDK_DISABLED", "true")]), Ok(None));
        assert_eq!(parse(&[e, ("OTEL_TRACES_EXPORTER", "none")]), Ok(None));
    }

    #[test]
    fn endpoints_resolve_as_the_exporter_specification_says() {
        let s = parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/")])
            .unwrap()
            .unwrap();
        assert_eq!(s.traces_url, "http://collector:4318/v1/traces");
        assert_eq!(s.service_name, "qc-worker");
        assert_eq!(s.sampling, Sampling::ParentBased(Root::AlwaysOn));
        assert_eq!(s.timeout, EXPORT_TIMEOUT);
        let s = parse(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://ignored:4318"),
            ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://c:4318/custom"),
            ("OTEL_SERVICE_NAME", "orders-consumer"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "2500"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.traces_url, "http://c:4318/custom");
        assert_eq!(s.service_name, "orders-consumer");
        assert_eq!(s.timeout, Duration::from_millis(2500));
    }

    #[test]
    fn samplers_parse_and_bad_values_name_the_variable_and_the_fix() {
        let e = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let sampling = |v: &[(&str, &str)]| {
            let mut all = vec![e];
            all.extend_from_slice(v);
            parse(&all).map(|s| s.unwrap().sampling)
        };
        let cases: &[(&[(&str, &str)], Sampling)] = &[
            (
                &[
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "0.01"),
                ],
                Sampling::ParentBased(Root::Ratio(0.01)),
            ),
            (
                &[("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")],
                Sampling::ParentBased(Root::Ratio(1.0)),
            ),
            (
                &[
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "0"),
                ],
                Sampling::Ratio(0.0),
            ),
            (
                &[("OTEL_TRACES_SAMPLER", "parentbased_always_off")],
                Sampling::ParentBased(Root::AlwaysOff),
            ),
            (&[("OTEL_TRACES_SAMPLER", "always_on")], Sampling::AlwaysOn),
            (
                &[("OTEL_TRACES_SAMPLER", "always_off")],
                Sampling::AlwaysOff,
            ),
        ];
        for (vars, want) in cases {
            assert_eq!(sampling(vars), Ok(*want), "{vars:?}");
        }
        let err = sampling(&[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "5%"),
        ])
        .unwrap_err();
        assert_eq!(err, OtlpError::SamplerArg("5%".into()));
        assert!(err.to_string().contains("from 0 to 1"), "{err}");
        assert!(
            sampling(&[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
            ])
            .is_err()
        );
        let err = sampling(&[("OTEL_TRACES_SAMPLER", "xray")]).unwrap_err();
        assert!(
            err.to_string().contains("parentbased_traceidratio"),
            "{err}"
        );
    }

    #[test]
    fn endpoints_the_exporter_cannot_reach_are_refused_with_the_fix() {
        for (value, want) in [
            ("https://c:4318", "https is not supported"),
            ("c:4318", "http://"),
            ("not a url", "not a URL"),
        ] {
            let err = parse(&[("OTEL_EXPORTER_OTLP_ENDPOINT", value)]).unwrap_err();
            let text = err.to_string();
            assert!(text.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{text}");
            assert!(text.contains(want), "{value}: {text}");
        }
        let err = parse(&[("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://c")]).unwrap_err();
        assert!(
            err.to_string()
                .contains("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        );
        assert!(
            parse(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_EXPORTER_OTLP_TIMEOUT", "10s"),
            ])
            .is_err()
        );
    }
}
