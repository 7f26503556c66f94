//! Tenancy (#28): what one QueueConsumer's AWS calls may reach and what it may learn about another's
//! queues, against the in-memory Kubernetes API and moto through the real SDK provider.

mod common;
mod fake_kube;

use std::sync::Arc;

use common::fixture::consumer;
use fake_kube::aws::TEST_WORKER_IMAGE;
use fake_kube::{FakeKube, QUEUE_CONSUMERS};
use qc::api::QueueConsumer;
use qc::aws::endpoints::AllowedEndpoints;
use qc::controller::observe::SdkProvider;
use qc::controller::{Context, reconcile};
use qc::render::RenderOptions;
use serde_json::{Value, json};

const NS: &str = "team-a";

/// A controller context with the real SDK provider (clients per region and endpoint) and moto's
/// endpoint allowed.
fn sdk_context(fake: &FakeKube) -> Arc<Context> {
    let mut ctx = Context::new(
        fake.client(),
        Arc::new(SdkProvider::default()),
        RenderOptions {
            worker_image: TEST_WORKER_IMAGE.into(),
        },
        None,
    );
    ctx.endpoints = AllowedEndpoints::parse([common::sqs_endpoint()]).unwrap();
    Arc::new(ctx)
}

async fn sqs_in(region: &str) -> aws_sdk_sqs::Client {
    let conf = qc::aws::sdk_config(Some(region), Some(&common::sqs_endpoint())).await;
    aws_sdk_sqs::Client::new(&conf)
}

fn manifest(name: &str, url: &str, region: &str) -> Value {
    consumer(name)
        .namespace(NS)
        .on_moto(url)
        .set("/spec/queue/region", region)
        .timeout("10s")
        .wait_time("1s")
        .image("team-a/orders:1")
        .alarm(false)
        // Long enough that both reconciles fall in one interval: the cache would hand the second
        // the first one's read if it took the two for one queue.
        .scaling(json!({"pollInterval": "5m"}))
        .json()
}

fn qc(fake: &FakeKube, name: &str) -> QueueConsumer {
    serde_json::from_value(fake.get(QUEUE_CONSUMERS, NS, name).unwrap()).unwrap()
}

/// Behind an endpoint that serves several regions (moto, LocalStack) one URL names a queue per region.
/// Two QueueConsumers with that URL and two regions read two queues: before, the facts cache was
/// keyed by endpoint and URL, and the second took the first one's counts.
#[tokio::test]
async fn one_url_in_two_regions_is_two_queues_and_never_shares_counts() {
    let name = common::unique_name("orders");
    let east = common::create_queue(&sqs_in("us-east-1").await, &name, &[]).await;
    let west_client = sqs_in("eu-west-1").await;
    let west = common::create_queue(&west_client, &name, &[]).await;
    assert_eq!(east, west, "moto names both queues by one URL");
    common::send_numbered(&west_client, &west, "m", 3).await;

    let fake = FakeKube::new();
    let ctx = sdk_context(&fake);
    fake.create(QUEUE_CONSUMERS, manifest("east", &east, "us-east-1"));
    fake.create(QUEUE_CONSUMERS, manifest("west", &west, "eu-west-1"));
    for n in ["east", "west"] {
        reconcile(Arc::new(qc(&fake, n)), ctx.clone())
            .await
            .unwrap();
    }
    let visible = |n| qc(&fake, n).status.unwrap().queue.unwrap().visible;
    assert_eq!(visible("east"), Some(0), "us-east-1's queue is empty");
    assert_eq!(
        visible("west"),
        Some(3),
        "eu-west-1's queue holds three, whatever us-east-1's read said"
    );
}
