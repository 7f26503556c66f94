//! AWS adapters: SQS queue facts behind a small trait (real SDK and test doubles).
//! `facts` is pure parsing; the SDK-backed adapter lives in `sqs`.

pub mod cloudwatch;
pub mod facts;
pub mod sqs;

pub use facts::{DeadLetterFacts, Facts, FactsError, QueueArn, QueueFacts, RedrivePolicy};
pub use sqs::{ObserveError, QueueReader, SqsError, SqsReader, StaticReader, observe};

/// Shared SDK configuration: region (explicit, else from the queue URL, else the environment) and an
/// optional endpoint override for local emulators. Credentials come from the default chain.
pub async fn sdk_config(region: Option<&str>, endpoint: Option<&str>) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region.to_string()));
    }
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    loader.load().await
}

/// An error and its sources, joined with `: ` (the SDK's and our HTTP client's errors keep the
/// useful part, such as "invalid peer certificate", in a source).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}
