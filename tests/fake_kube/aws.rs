//! The controller's AWS side for tests against the in-memory API: a CloudWatch that accepts every
//! call, one that must never be reached, and a controller `Context` wired to a given queue reader.

use std::sync::Arc;

use qc::aws::QueueReader;
use qc::aws::cloudwatch::{
    AlarmDeletion, AlarmOwner, AlarmSpec, Alarms, CloudWatchError, ObservedAlarm,
};
use qc::aws::endpoints::AllowedEndpoints;
use qc::controller::Context;
use qc::controller::observe::{AwsClients, FixedProvider};
use qc::render::RenderOptions;

use super::FakeKube;

/// The worker image every test context renders, so tests can assert it.
pub const TEST_WORKER_IMAGE: &str = "qc:test";

/// CloudWatch that accepts every call and has no alarms and no metrics.
pub struct NoAlarms;

#[async_trait::async_trait]
impl Alarms for NoAlarms {
    async fn describe(&self, _: &str) -> Result<Option<ObservedAlarm>, CloudWatchError> {
        Ok(None)
    }
    async fn put(&self, _: &AlarmSpec, _: &AlarmOwner) -> Result<(), CloudWatchError> {
        Ok(())
    }
    async fn delete(&self, _: &str, _: &AlarmOwner) -> Result<AlarmDeletion, CloudWatchError> {
        Ok(AlarmDeletion::Absent)
    }
    async fn oldest_message_age(&self, _: &str) -> Result<Option<i64>, CloudWatchError> {
        Ok(None)
    }
}

/// CloudWatch that must not be reached: tests with it keep `deadLetter.alarm` off. The DLQ's age
/// metric answers "no data", as CloudWatch does for a queue without datapoints.
pub struct UnreachableCloudWatch;

#[async_trait::async_trait]
impl Alarms for UnreachableCloudWatch {
    async fn describe(&self, _: &str) -> Result<Option<ObservedAlarm>, CloudWatchError> {
        panic!("unexpected CloudWatch call")
    }
    async fn put(&self, _: &AlarmSpec, _: &AlarmOwner) -> Result<(), CloudWatchError> {
        panic!("unexpected CloudWatch call")
    }
    async fn delete(&self, _: &str, _: &AlarmOwner) -> Result<AlarmDeletion, CloudWatchError> {
        panic!("unexpected CloudWatch call")
    }
    async fn oldest_message_age(&self, _: &str) -> Result<Option<i64>, CloudWatchError> {
        Ok(None)
    }
}

/// A controller context on `fake` whose every region and endpoint reads through `sqs` and `alarms`;
/// `identity` is the leader-election holder (None: no election). The test server's endpoint, which
/// manifests name in `spec.queue.endpoint`, is allowed explicitly, as an operator would allow it.
pub fn context(
    fake: &FakeKube,
    sqs: Arc<dyn QueueReader>,
    alarms: Arc<dyn Alarms>,
    identity: Option<&str>,
) -> Arc<Context> {
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(FixedProvider(AwsClients { sqs, alarms })),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
            ..Default::default()
        },
        identity.map(str::to_string),
    );
    ctx.endpoints = AllowedEndpoints::parse(std::env::var("QC_TEST_SQS_ENDPOINT").ok())
        .expect("QC_TEST_SQS_ENDPOINT is an http://HOST:PORT endpoint");
    Arc::new(ctx)
}
