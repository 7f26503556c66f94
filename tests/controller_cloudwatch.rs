//! The CloudWatch adapter against a real CloudWatch-compatible server (moto): the DLQ alarm's
//! lifecycle and the age-of-oldest-message read.
#![allow(clippy::unwrap_used)]

mod common;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};
use qc::aws::cloudwatch::{Alarms, CloudWatchAlarms, dead_letter_alarm};

async fn cloudwatch() -> aws_sdk_cloudwatch::Client {
    let conf = qc::aws::sdk_config(Some("us-east-1"), Some(&common::sqs_endpoint())).await;
    aws_sdk_cloudwatch::Client::new(&conf)
}

#[tokio::test]
async fn alarm_created_read_back_updated_and_deleted() {
    let alarms = CloudWatchAlarms::new(cloudwatch().await);
    let name = common::unique_name("qc-alarm");
    let dlq = common::unique_name("dlq");
    assert_eq!(alarms.describe(&name).await.unwrap(), None);
    let want = dead_letter_alarm(&name, &dlq, "shop", "orders");
    alarms.put(&want).await.unwrap();
    let got = alarms.describe(&name).await.unwrap().unwrap();
    assert_eq!(got.spec, want, "the alarm reads back as it was written");
    assert!(
        ["OK", "ALARM", "INSUFFICIENT_DATA"].contains(&got.state.as_str()),
        "{}",
        got.state
    );
    let mut changed = want.clone();
    changed.queue_name = format!("{dlq}-2");
    alarms.put(&changed).await.unwrap();
    assert_eq!(
        alarms
            .describe(&name)
            .await
            .unwrap()
            .unwrap()
            .spec
            .queue_name,
        changed.queue_name
    );
    alarms.delete(&name).await.unwrap();
    assert_eq!(alarms.describe(&name).await.unwrap(), None);
    alarms
        .delete(&name)
        .await
        .expect("deleting a missing alarm succeeds");
}

#[tokio::test]
async fn oldest_age_reads_the_latest_datapoint() {
    let cw = cloudwatch().await;
    let alarms = CloudWatchAlarms::new(cw.clone());
    let queue = common::unique_name("dlq-age");
    assert_eq!(alarms.oldest_message_age(&queue).await.unwrap(), None);
    cw.put_metric_data()
        .namespace("AWS/SQS")
        .metric_data(
            MetricDatum::builder()
                .metric_name("ApproximateAgeOfOldestMessage")
                .dimensions(Dimension::builder().name("QueueName").value(&queue).build())
                .value(321.0)
                .unit(StandardUnit::Seconds)
                .build(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(alarms.oldest_message_age(&queue).await.unwrap(), Some(321));
}
