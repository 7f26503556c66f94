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

/// A client as `kube::Client::try_default` makes one, with the operator's User-Agent and field manager.
pub async fn client() -> Result<kube::Client, ClientError> {
    let config = with_user_agent(kube::Config::infer().await?);
    let builder = kube::client::ClientBuilder::try_from(config)?;
    Ok(builder
        .with_layer(&tower::util::MapRequestLayer::new(with_field_manager))
        .build())
}

#[cfg(test)]
mod tests {
    use super::*;

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
