//! The CloudWatch adapter against a real CloudWatch-compatible server (moto): the DLQ alarm's
//! lifecycle, the age-of-oldest-message read, and the batching of both across QueueConsumers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};
use qc::aws::cloudwatch::{
    AlarmDeletion, AlarmOwner, Alarms, BatchOptions, CloudWatchAlarms, dead_letter_alarm,
};
use qc::aws::limit::{LimitConfig, Limiter};

fn owner(uid: &str) -> AlarmOwner {
    AlarmOwner {
        uid: uid.into(),
        namespace: "shop".into(),
        name: "orders".into(),
    }
}

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
    alarms.put(&want, &owner("u1")).await.unwrap();
    let got = alarms.describe(&name).await.unwrap().unwrap();
    assert_eq!(got.spec, want, "the alarm reads back as it was written");
    assert!(
        ["OK", "ALARM", "INSUFFICIENT_DATA"].contains(&got.state.as_str()),
        "{}",
        got.state
    );
    let mut changed = want.clone();
    changed.queue_name = format!("{dlq}-2");
    alarms.put(&changed, &owner("u1")).await.unwrap();
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
    // Another QueueConsumer's uid: the alarm is not its to delete.
    assert!(matches!(
        alarms.delete(&name, &owner("u2")).await.unwrap(),
        AlarmDeletion::NotOurs { .. }
    ));
    assert!(
        alarms.describe(&name).await.unwrap().is_some(),
        "alarm survives"
    );
    assert_eq!(
        alarms.delete(&name, &owner("u1")).await.unwrap(),
        AlarmDeletion::Deleted
    );
    assert_eq!(alarms.describe(&name).await.unwrap(), None);
    assert_eq!(
        alarms
            .delete(&name, &owner("u1"))
            .await
            .expect("deleting a missing alarm succeeds"),
        AlarmDeletion::Absent
    );
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

/// A client that batches like the controller does: reads within 300 ms share calls, metric values
/// are reused for a minute and alarm descriptions for five.
fn batched(cw: aws_sdk_cloudwatch::Client) -> CloudWatchAlarms {
    CloudWatchAlarms::with_options(
        cw,
        Arc::new(Limiter::new("cloudwatch", LimitConfig::new(50.0, 4))),
        BatchOptions {
            window: Duration::from_millis(300),
            alarm_max_age: Duration::from_secs(300),
            metric_max_age: Duration::from_secs(60),
        },
    )
}

async fn put_ages(cw: &aws_sdk_cloudwatch::Client, queues: &[String]) {
    // PutMetricData takes up to 1,000 datums; 20 a call keeps each request small.
    for (n, chunk) in queues.chunks(20).enumerate() {
        let data = chunk.iter().enumerate().map(|(i, q)| {
            MetricDatum::builder()
                .metric_name("ApproximateAgeOfOldestMessage")
                .dimensions(Dimension::builder().name("QueueName").value(q).build())
                .value((n * 20 + i + 1) as f64)
                .unit(StandardUnit::Seconds)
                .build()
        });
        cw.put_metric_data()
            .namespace("AWS/SQS")
            .set_metric_data(Some(data.collect()))
            .send()
            .await
            .unwrap();
    }
}

/// N QueueConsumers' age reads in one poll interval: ceil(N / 500) GetMetricData calls in all, each
/// reader gets its own queue's value back, and the next interval within the minute costs nothing.
#[tokio::test]
async fn many_queues_ages_take_one_get_metric_data_per_500() {
    let cw = cloudwatch().await;
    for n in [1usize, 120, 620] {
        let queues: Vec<String> = (0..n).map(|_| common::unique_name("age")).collect();
        put_ages(&cw, &queues).await;
        let alarms = batched(cw.clone());
        let reads = queues.iter().map(|q| alarms.oldest_message_age(q));
        let ages = futures::future::join_all(reads).await;
        for (i, age) in ages.into_iter().enumerate() {
            assert_eq!(age.unwrap(), Some(i as i64 + 1), "queue {i} of {n}");
        }
        assert_eq!(
            alarms.limiter().calls_of("GetMetricData"),
            n.div_ceil(500) as u64,
            "{n} queues"
        );
        // The next interval (within SQS metrics' minute) reads nothing.
        let again = futures::future::join_all(queues.iter().map(|q| alarms.oldest_message_age(q)));
        assert!(again.await.iter().all(Result::is_ok));
        assert_eq!(
            alarms.limiter().calls_of("GetMetricData"),
            n.div_ceil(500) as u64
        );
        assert_eq!(alarms.limiter().calls_of("GetMetricStatistics"), 0);
    }
}

/// Describing N alarms at once takes ceil(N / 100) DescribeAlarms, and each caller gets its own
/// alarm; a write drops the cached description so the read-back sees CloudWatch.
#[tokio::test]
async fn many_alarm_describes_take_one_describe_alarms_per_100() {
    let cw = cloudwatch().await;
    // Moto does not throttle: the writer's gate is wide so that setting up 130 alarms is quick.
    let writer = CloudWatchAlarms::with_options(
        cw.clone(),
        Arc::new(Limiter::new("cloudwatch", LimitConfig::new(1000.0, 8))),
        BatchOptions::default(),
    );
    let n = 130;
    let specs: Vec<_> = (0..n)
        .map(|i| {
            dead_letter_alarm(
                &common::unique_name("qc-batch"),
                &format!("dlq-{i}"),
                "shop",
                &format!("c{i}"),
            )
        })
        .collect();
    for s in &specs {
        writer.put(s, &owner("u1")).await.unwrap();
    }
    let missing = common::unique_name("qc-none");
    let alarms = batched(cw.clone());
    let (found, none) = tokio::join!(
        futures::future::join_all(specs.iter().map(|s| alarms.describe(&s.name))),
        alarms.describe(&missing)
    );
    for (s, got) in specs.iter().zip(found) {
        assert_eq!(got.unwrap().unwrap().spec, *s);
    }
    assert_eq!(none.unwrap(), None);
    assert_eq!(alarms.limiter().calls_of("DescribeAlarms"), 2);
    // Cached for the resync period ...
    alarms.describe(&specs[0].name).await.unwrap();
    assert_eq!(alarms.limiter().calls_of("DescribeAlarms"), 2);
    // ... except after a write of its own.
    let mut changed = specs[0].clone();
    changed.queue_name = "dlq-moved".into();
    alarms.put(&changed, &owner("u1")).await.unwrap();
    let got = alarms.describe(&changed.name).await.unwrap().unwrap();
    assert_eq!(got.spec.queue_name, "dlq-moved");
    assert_eq!(alarms.limiter().calls_of("DescribeAlarms"), 3);
    for s in &specs {
        writer.delete(&s.name, &owner("u1")).await.unwrap();
    }
}

#[tokio::test]
async fn an_alarm_not_made_by_the_operator_is_never_deleted() {
    let cw = cloudwatch().await;
    let alarms = CloudWatchAlarms::new(cw.clone());
    let name = common::unique_name("qc-foreign");
    // Made by someone else, without the operator's tags.
    cw.put_metric_alarm()
        .alarm_name(&name)
        .namespace("AWS/SQS")
        .metric_name("ApproximateNumberOfMessagesVisible")
        .statistic(aws_sdk_cloudwatch::types::Statistic::Maximum)
        .comparison_operator(aws_sdk_cloudwatch::types::ComparisonOperator::GreaterThanThreshold)
        .threshold(0.0)
        .period(60)
        .evaluation_periods(1)
        .send()
        .await
        .unwrap();
    let got = alarms.delete(&name, &owner("u1")).await.unwrap();
    assert!(
        matches!(&got, AlarmDeletion::NotOurs { why } if why.contains("managed-by")),
        "{got:?}"
    );
    assert!(
        alarms.describe(&name).await.unwrap().is_some(),
        "alarm survives"
    );
}
