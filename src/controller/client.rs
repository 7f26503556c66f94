//! The operator's connection to the API server: the kubeconfig or in-cluster service account, with a
//! User-Agent naming the operator and its version, so audit logs and priority-and-fairness tell it apart,
//! and a field manager on every write.

use super::apply::FIELD_MANAGER;

/// What every request of the operator says it is (`qc-operator/0.1.0`).
pub const USER_AGENT: &str = concat!("qc-operator/", env!("CARGO_PKG_VERSION"));

/// Why no client could be made.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("find the Kubernetes API (in-cluster service account or KUBECONFIG): {0}")]
    Infer(#[from] kube::config::InferConfigError),
    #[error("build the Kubernetes client: {0}")]
    Build(#[from] kube::Error),
}

/// `config` with the operator's User-Agent on every request.
pub fn with_user_agent(mut config: kube::Config) -> kube::Config {
    config
        .headers
        .retain(|(name, _)| name != http::header::USER_AGENT);
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(USER_AGENT),
    ));
    config
}

/// A write (create, update, patch) without a `fieldManager` gets the operator's, `qc-operator`: the writes
/// of the libraries it uses (kube's Event recorder, the lease manager's create) name none, and the API
/// server would record them as `unknown` in managedFields. The operator's own writes name theirs.
pub fn with_field_manager(
    mut req: http::Request<kube::client::Body>,
) -> http::Request<kube::client::Body> {
    let write = matches!(
        *req.method(),
        http::Method::POST | http::Method::PUT | http::Method::PATCH
    );
    let query = req.uri().query().unwrap_or("");
    if !write || query.split('&').any(|p| p.starts_with("fieldManager=")) {
        return req;
    }
    let path_and_query = if query.is_empty() {
        format!("{}?fieldManager={FIELD_MANAGER}", req.uri().path())
    } else {
        format!("{}?{query}&fieldManager={FIELD_MANAGER}", req.uri().path())
    };
    let mut parts = req.uri().clone().into_parts();
    if let Ok(pq) = path_and_query.parse() {
        parts.path_and_query = Some(pq);
        if let Ok(uri) = http::Uri::from_parts(parts) {
            *req.uri_mut() = uri;
        }
    }
    req
}

/// A client as `kube::Client::try_default` makes one, with the operator's User-Agent and field manager,
/// its requests counted in `qc_kube_requests_total`.
pub async fn client() -> Result<kube::Client, ClientError> {
    let config = with_user_agent(kube::Config::infer().await?);
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&tower::util::MapRequestLayer::new(with_field_manager))
        .with_layer(&tower::layer::layer_fn(|inner| Counted { inner }))
        .build())
}

/// The operator's Kubernetes API requests by method (`WATCH` for a GET with `watch=true`) and answer
/// (the status code, or `<error>` when none came), as client-go's `rest_client_requests_total`.
static KUBE_REQUESTS: std::sync::Mutex<std::collections::BTreeMap<(&'static str, String), u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// The method label of a request.
pub fn method_label(method: &http::Method, query: Option<&str>) -> &'static str {
    let watch = query.is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match *method {
        http::Method::GET if watch => "WATCH",
        http::Method::GET => "GET",
        http::Method::POST => "POST",
        http::Method::PUT => "PUT",
        http::Method::PATCH => "PATCH",
        http::Method::DELETE => "DELETE",
        _ => "OTHER",
    }
}

fn count_request(method: &'static str, code: String) {
    *crate::sync::lock(&KUBE_REQUESTS)
        .entry((method, code))
        .or_default() += 1;
}

/// `qc_kube_requests_total{method,code}` into `e`.
pub fn render_into(e: &mut crate::telemetry::Exposition) {
    let counts: Vec<((&'static str, String), u64)> = crate::sync::lock(&KUBE_REQUESTS)
        .iter()
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let labels: Vec<[(&str, &str); 2]> = counts
        .iter()
        .map(|((m, c), _)| [("method", *m), ("code", c.as_str())])
        .collect();
    let samples: Vec<_> = labels
        .iter()
        .zip(&counts)
        .map(|(l, (_, n))| (&l[..], *n))
        .collect();
    e.counter(
        "qc_kube_requests_total",
        "Kubernetes API requests of the operator by method (WATCH: a watch) and status code (<error>: no answer).",
        &samples,
    );
}

/// Counts each request once its answer (or failure) is in.
#[derive(Clone)]
pub struct Counted<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<kube::client::Body>> for Counted<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future =
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let method = method_label(req.method(), req.uri().query());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            let code = match &result {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            count_request(method, code);
            result
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_told_from_gets() {
        assert_eq!(
            method_label(&http::Method::GET, Some("watch=true&resourceVersion=1")),
            "WATCH"
        );
        assert_eq!(method_label(&http::Method::GET, Some("limit=500")), "GET");
        assert_eq!(method_label(&http::Method::GET, None), "GET");
        assert_eq!(
            method_label(&http::Method::PATCH, Some("fieldManager=qc-operator")),
            "PATCH"
        );
    }

    #[test]
    fn the_user_agent_names_the_operator_and_its_version() {
        let config = with_user_agent(kube::Config::new("https://127.0.0.1:6443".parse().unwrap()));
        let agents: Vec<_> = config
            .headers
            .iter()
            .filter(|(n, _)| n == http::header::USER_AGENT)
            .map(|(_, v)| v.to_str().unwrap().to_string())
            .collect();
        assert_eq!(
            agents,
            [format!("qc-operator/{}", env!("CARGO_PKG_VERSION"))]
        );
    }
}
