//! Which `spec.queue.endpoint` values the controller sends signed requests to: AWS's own SQS and
//! CloudWatch endpoints, plus the operator's allow-list (`run --allowed-endpoint`, chart `aws.allowedEndpoints`).
//! Pure: patterns in, a verdict out. A tenant's endpoint that is not allowed gets no request at all.

use url::Url;

/// The chart value an operator sets to allow an endpoint, named in every refusal.
pub const ALLOW_SETTING: &str = "aws.allowedEndpoints";

/// Why an endpoint or an allow-list pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EndpointError {
    #[error(
        "allowed endpoint pattern {pattern:?}: {problem}; write SCHEME://HOST[:PORT], e.g. http://moto.test.svc:5000 or https://*.sqs.example.internal:*"
    )]
    BadPattern { pattern: String, problem: String },
    #[error(
        "spec.queue.endpoint {endpoint:?} is not allowed by this operator ({why}): remove spec.queue.endpoint to use AWS's own endpoint of the region, or ask the operator's administrator to add it to the chart value {ALLOW_SETTING}"
    )]
    NotAllowed { endpoint: String, why: String },
}

impl EndpointError {
    /// CamelCase reason for conditions and Events.
    pub fn reason(&self) -> &'static str {
        match self {
            EndpointError::BadPattern { .. } => "InvalidAllowedEndpoint",
            EndpointError::NotAllowed { .. } => {
                crate::api::conditions::reason::ENDPOINT_NOT_ALLOWED
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    /// `*.example.com`: one or more labels before `.example.com` (stored with its leading dot).
    Subdomain(String),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum PortPattern {
    Any,
    Exact(u16),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Pattern {
    scheme: String,
    host: HostPattern,
    port: PortPattern,
}

/// AWS's own endpoints, always allowed, plus the operator's patterns.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllowedEndpoints {
    patterns: Vec<Pattern>,
}

impl AllowedEndpoints {
    /// AWS's own endpoints only (the default).
    pub fn aws_only() -> Self {
        Self::default()
    }

    /// Parse the operator's patterns; empty entries are skipped (a chart list rendered empty).
    pub fn parse<I, S>(patterns: I) -> Result<Self, EndpointError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out = Vec::new();
        for p in patterns {
            let p = p.as_ref().trim();
            if !p.is_empty() {
                out.push(parse_pattern(p)?);
            }
        }
        Ok(AllowedEndpoints { patterns: out })
    }

    /// Whether the controller may send requests to `endpoint`.
    pub fn check(&self, endpoint: &str) -> Result<(), EndpointError> {
        let refuse = |why: &str| EndpointError::NotAllowed {
            endpoint: endpoint.to_string(),
            why: why.to_string(),
        };
        if endpoint
            .chars()
            .any(|c| c.is_control() || c.is_whitespace())
        {
            return Err(refuse("it holds whitespace or control characters"));
        }
        let url = Url::parse(endpoint).map_err(|e| refuse(&format!("not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(refuse("only http and https endpoints exist"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(refuse("credentials in the URL"));
        }
        if url.query().is_some() || url.fragment().is_some() || !matches!(url.path(), "" | "/") {
            return Err(refuse(
                "an endpoint is SCHEME://HOST[:PORT], without path, query or fragment",
            ));
        }
        let Some(host) = url.host_str().map(str::to_ascii_lowercase) else {
            return Err(refuse("no host"));
        };
        // The SDK reads the endpoint with another parser (`http::Uri`), which takes the host as
        // written: a spelling the URL standard rewrites (IPv4 shorthand `1` = `0.0.0.1`, hex or
        // octal numbers, percent-encoding, non-ASCII) would be checked as one host and connected to
        // as another (tests/fuzz.rs, `endpoint_allow_list`).
        if written_host(endpoint)
            .map(str::to_ascii_lowercase)
            .as_deref()
            != Some(host.as_str())
        {
            return Err(refuse(&format!(
                "its host is not written as URL parsers agree on it: write {}://{host}",
                url.scheme()
            )));
        }
        let Some(port) = url.port_or_known_default() else {
            return Err(refuse("no port"));
        };
        if url.scheme() == "https" && port == 443 && is_aws_host(&host) {
            return Ok(());
        }
        if self.patterns.iter().any(|p| {
            p.scheme == url.scheme() && host_matches(&p.host, &host) && port_matches(&p.port, port)
        }) {
            return Ok(());
        }
        Err(refuse(if self.patterns.is_empty() {
            "only AWS's own SQS and CloudWatch endpoints are allowed"
        } else {
            "it matches no allowed pattern and is not an AWS SQS or CloudWatch endpoint"
        }))
    }
}

/// The host of `SCHEME://[USERINFO@]HOST[:PORT][/...]` as written (an IPv6 literal with its brackets).
fn written_host(endpoint: &str) -> Option<&str> {
    let (_, rest) = endpoint.split_once("://")?;
    let authority = rest.split(['/', '?', '#', '\\']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.starts_with('[') {
        return host_port.find(']').map(|end| &host_port[..=end]);
    }
    Some(host_port.rsplit_once(':').map_or(host_port, |(h, _)| h))
}

fn host_matches(p: &HostPattern, host: &str) -> bool {
    match p {
        HostPattern::Exact(h) => h == host,
        HostPattern::Subdomain(suffix) => {
            host.len() > suffix.len() && host.ends_with(suffix.as_str())
        }
    }
}

fn port_matches(p: &PortPattern, port: u16) -> bool {
    match p {
        PortPattern::Any => true,
        PortPattern::Exact(want) => *want == port,
    }
}

fn parse_pattern(p: &str) -> Result<Pattern, EndpointError> {
    let bad = |problem: &str| EndpointError::BadPattern {
        pattern: p.to_string(),
        problem: problem.to_string(),
    };
    let (scheme, rest) = p
        .split_once("://")
        .ok_or_else(|| bad("no scheme (http:// or https://)"))?;
    let scheme = scheme.to_ascii_lowercase();
    if !matches!(scheme.as_str(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@'])
        || rest.chars().any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad(
            "only SCHEME://HOST[:PORT]: no path, query, credentials or spaces",
        ));
    }
    // An IPv6 literal keeps its brackets, as url::Url::host_str writes it.
    let (host, port) = if rest.starts_with('[') {
        let end = rest
            .find(']')
            .ok_or_else(|| bad("unclosed [ of an IPv6 address"))?;
        let (h, after) = rest.split_at(end + 1);
        match after.strip_prefix(':') {
            Some(port) => (h, Some(port)),
            None if after.is_empty() => (h, None),
            None => return Err(bad("text after the IPv6 address")),
        }
    } else {
        match rest.rsplit_once(':') {
            Some((h, port)) => (h, Some(port)),
            None => (rest, None),
        }
    };
    let host = host.to_ascii_lowercase();
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let host = match host.strip_prefix('*') {
        Some(suffix) if suffix.starts_with('.') && suffix.len() > 1 && !suffix.contains('*') => {
            HostPattern::Subdomain(suffix.to_string())
        }
        Some(_) => {
            return Err(bad(
                "a wildcard is only allowed as the first label: *.example.com",
            ));
        }
        None if host.contains('*') => {
            return Err(bad(
                "a wildcard is only allowed as the first label: *.example.com",
            ));
        }
        None => HostPattern::Exact(host),
    };
    let port = match port {
        None => PortPattern::Exact(if scheme == "https" { 443 } else { 80 }),
        Some("*") => PortPattern::Any,
        Some(n) => PortPattern::Exact(
            n.parse::<u16>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| bad("the port must be 1..65535 or *"))?,
        ),
    };
    Ok(Pattern { scheme, host, port })
}

/// AWS's SQS and CloudWatch endpoints of a region (standard and FIPS, in the commercial and China
/// partitions and the dual-stack `api.aws` domain), and their interface VPC endpoints. Exactly these
/// shapes: other hosts under amazonaws.com (API Gateway stages, S3 buckets) belong to other
/// accounts and may be a tenant's own.
fn is_aws_host(host: &str) -> bool {
    const SERVICES: [&str; 4] = ["sqs", "sqs-fips", "monitoring", "monitoring-fips"];
    const DOMAINS: [&[&str]; 3] = [
        &["amazonaws", "com"],
        &["amazonaws", "com", "cn"],
        &["api", "aws"],
    ];
    let labels: Vec<&str> = host.split('.').collect();
    let domain_at =
        |at: usize, domains: &[&[&str]]| domains.iter().any(|d| labels.get(at..) == Some(*d));
    // sqs.us-east-1.amazonaws.com
    if labels.len() >= 4
        && SERVICES.contains(&labels[0])
        && is_region(labels[1])
        && domain_at(2, &DOMAINS)
    {
        return true;
    }
    // vpce-0123-abcd.sqs.us-east-1.vpce.amazonaws.com
    labels.len() >= 6
        && labels[0].starts_with("vpce-")
        && labels[0][5..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-')
        && labels[0].len() > 5
        && SERVICES.contains(&labels[1])
        && is_region(labels[2])
        && labels[3] == "vpce"
        && domain_at(4, &DOMAINS[..2])
}

/// `us-east-1`, `ap-southeast-2`, `us-gov-west-1`, `cn-north-1`.
fn is_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    parts.len() >= 3
        && parts[0].len() == 2
        && parts[..parts.len() - 1]
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase()))
        && parts[parts.len() - 1].parse::<u8>().is_ok_and(|n| n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(patterns: &[&str]) -> AllowedEndpoints {
        AllowedEndpoints::parse(patterns).unwrap()
    }

    #[test]
    fn aws_endpoints_are_allowed_without_configuration() {
        let a = AllowedEndpoints::aws_only();
        for ok in [
            "https://sqs.us-east-1.amazonaws.com",
            "https://sqs.us-east-1.amazonaws.com/",
            "https://SQS.eu-west-1.AMAZONAWS.com",
            "https://sqs-fips.us-gov-west-1.amazonaws.com",
            "https://monitoring.ap-southeast-2.amazonaws.com:443",
            "https://sqs.cn-north-1.amazonaws.com.cn",
            "https://sqs.us-east-1.api.aws",
            "https://vpce-0a1b2c3d-x1y2.sqs.us-east-1.vpce.amazonaws.com",
        ] {
            assert_eq!(a.check(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn anything_else_is_refused_by_default() {
        let a = AllowedEndpoints::aws_only();
        for bad in [
            "http://169.254.169.254",
            "http://169.254.169.254/latest/meta-data/",
            "http://sqs.us-east-1.amazonaws.com",
            "https://sqs.us-east-1.amazonaws.com:8443",
            "https://sqs.us-east-1.amazonaws.com.evil.example",
            "https://abcd1234.execute-api.us-east-1.amazonaws.com",
            "https://sqs.us-east-1.s3.amazonaws.com",
            "https://bucket.s3.amazonaws.com",
            "https://sqs.amazonaws.com@evil.example",
            "https://evil.example/sqs.us-east-1.amazonaws.com",
            "https://evil.example#.sqs.us-east-1.amazonaws.com",
            "https://sqs.us-east-1.amazonaws.com.",
            "https://sqs.us-east-1.amazonaws.com/\r\nX: y",
            "http://localhost:4566",
            "file:///etc/passwd",
            "not a url",
            "",
        ] {
            let e = a.check(bad).unwrap_err();
            assert_eq!(e.reason(), "EndpointNotAllowed", "{bad}");
            assert!(e.to_string().contains(ALLOW_SETTING), "{e}");
            assert!(e.to_string().contains("spec.queue.endpoint"), "{e}");
        }
    }

    #[test]
    fn operator_patterns_allow_exactly_what_they_name() {
        let a = allow(&[
            "http://moto.test.svc:5000",
            "https://*.sqs.example.internal:*",
            "http://127.0.0.1:4566/",
            "http://[::1]:4566",
        ]);
        for ok in [
            "http://moto.test.svc:5000",
            "http://MOTO.test.svc:5000/",
            "https://a.sqs.example.internal",
            "https://a.b.sqs.example.internal:8443",
            "http://127.0.0.1:4566",
            "http://[::1]:4566",
        ] {
            assert_eq!(a.check(ok), Ok(()), "{ok}");
        }
        for bad in [
            "https://moto.test.svc:5000",
            "http://moto.test.svc",
            "http://moto.test.svc:5001",
            "https://sqs.example.internal",
            "https://evilsqs.example.internal",
            "http://a.sqs.example.internal",
            "http://127.0.0.1:4567",
            "http://127.0.0.1:4566/path",
        ] {
            assert!(a.check(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn hosts_the_url_standard_rewrites_are_refused() {
        // Each is read by the URL standard as an allowed host, but as written by the SDK's parser.
        let a = allow(&["http://*.1:*", "http://127.0.0.1:4566", "http://*.svc:*"]);
        for bad in [
            "http://1",
            "http://0x7f.1:4566",
            "http://0177.0.0.1:4566",
            "http://2130706433:4566",
            "http://moto%2esvc:80",
            "http://m\u{f6}to.svc:80",
        ] {
            let e = a.check(bad).unwrap_err();
            assert!(
                e.to_string().contains("not written as URL parsers agree"),
                "{bad}: {e}"
            );
        }
        assert_eq!(a.check("http://moto.svc:80"), Ok(()));
    }

    #[test]
    fn bad_patterns_are_named() {
        for bad in [
            "moto:5000",
            "ftp://x",
            "http://",
            "http://a.*.example",
            "http://*example.com",
            "http://*.",
            "http://x:0",
            "http://x:99999",
            "http://x/path",
            "http://user@x",
            "http://[::1",
        ] {
            let e = AllowedEndpoints::parse([bad]).unwrap_err();
            assert_eq!(e.reason(), "InvalidAllowedEndpoint", "{bad}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert_eq!(
            AllowedEndpoints::parse(["", "  "]),
            Ok(AllowedEndpoints::aws_only())
        );
    }
}
