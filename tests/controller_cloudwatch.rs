//! The CloudWatch adapter against a real CloudWatch-compatible server (moto): the DLQ alarm's
//! lifecycle, the age-of-oldest-message read, and the batching of both across QueueConsumers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_cloudwatch::types::{Dimension, MetricDatum, StandardUnit};
use qc::aws::cloudwatch::{
    AlarmDeletion, AlarmOwner, AlarmWrite, Alarms, BatchOptions, CloudWatchAlarms, Ensured,
    dead_letter_alarm,
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
    common::put_oldest_age(&cw, &queue, 321.0).await;
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
            alarm_max_age: Duration::from_mins(5),
            metric_max_age: Duration::from_mins(1),
            refresh: None,
        },
    )
}

/// Puts queue i's oldest age as i + 1 seconds, `per_call` datums a PutMetricData (it takes up to
/// 1,000; small calls keep each request small, large ones keep hundreds of queues quick).
async fn put_ages(cw: &aws_sdk_cloudwatch::Client, queues: &[String], per_call: usize) {
    for (n, chunk) in queues.chunks(per_call).enumerate() {
        let data = chunk.iter().enumerate().map(|(i, q)| {
            MetricDatum::builder()
                .metric_name("ApproximateAgeOfOldestMessage")
                .dimensions(Dimension::builder().name("QueueName").value(q).build())
                .value((n * per_call + i + 1) as f64)
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
        put_ages(&cw, &queues, 20).await;
        let alarms = batched(cw.clone());
        let reads = queues.iter().map(|q| alarms.oldest_message_age(q));
        let ages = futures::future::join_all(reads).await;
        for (i, age) in ages.into_iter().enumerate() {
            assert_eq!(
                age.unwrap(),
                Some(i64::try_from(i).unwrap() + 1),
                "queue {i} of {n}"
            );
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

/// The controller's client: reads refreshed in the background, a pass every `every` (scaled down from
/// the 15 s poll interval), metric values kept for 20 passes and alarm descriptions for 8 (the
/// controller's 60 s and 5 min are 4 and 20 of its 15 s passes; longer here, see below).
fn background(cw: aws_sdk_cloudwatch::Client, every: Duration) -> CloudWatchAlarms {
    CloudWatchAlarms::with_options(
        cw,
        Arc::new(Limiter::new("cloudwatch", LimitConfig::new(1000.0, 8))),
        BatchOptions {
            window: Duration::from_millis(300),
            // Ages far above a pass's time, so that a moto slowed by a loaded machine (a pass of 500
            // metrics takes it seconds) never lets a value go stale: what these tests check is which
            // calls the passes make, not how fast moto answers them. The passes still fill their calls
            // (500 metrics, 100 alarms), so the counts asserted below do not depend on these ages.
            alarm_max_age: every * 8,
            metric_max_age: every * 20,
            refresh: Some(every),
        },
    )
}

/// 300 QueueConsumers' reads as the controller makes them (each the oldest age of its queue and of
/// its DLQ: 600 metrics; and 150 DLQ alarms), against moto, with the background refresher: no read
/// ever waits for CloudWatch; the new keys go out together (⌈600/500⌉ GetMetricData, ⌈150/100⌉
/// DescribeAlarms); then every pass (the poll interval) makes one GetMetricData and one
/// DescribeAlarms, each reading the share read longest ago, and every reader keeps getting its own
/// queue's value. (300, not 1,000: moto's GetMetricData scans every stored datapoint per query, so
/// 2,000 metrics take it longer than the scaled-down interval; the benchmark runs 1,000.)
#[tokio::test]
async fn many_consumers_cost_two_cloudwatch_calls_per_interval_in_the_background() {
    let cw = cloudwatch().await;
    let queues: Vec<String> = (0..600).map(|_| common::unique_name("bg-age")).collect();
    put_ages(&cw, &queues, 500).await;
    let writer = CloudWatchAlarms::with_options(
        cw.clone(),
        Arc::new(Limiter::new("cloudwatch", LimitConfig::new(1000.0, 8))),
        BatchOptions::default(),
    );
    let specs: Vec<_> = (0..150)
        .map(|i| {
            dead_letter_alarm(
                &common::unique_name("qc-bg"),
                &format!("dlq-{i}"),
                "shop",
                &format!("c{i}"),
            )
        })
        .collect();
    for s in &specs {
        writer.put(s, &owner("u1")).await.unwrap();
    }
    let every = Duration::from_secs(3);
    let alarms = background(cw.clone(), every);
    // What one round of reconciles reads: never waits, so it can be called in a tight loop.
    let round = || async {
        let mut ages = Vec::with_capacity(queues.len());
        for q in &queues {
            ages.push(alarms.known_oldest_message_age(q).await.unwrap());
        }
        let mut states = Vec::with_capacity(specs.len());
        for s in &specs {
            states.push(alarms.ensure(s, &owner("u1")).await);
        }
        (ages, states)
    };
    let (ages, states) = round().await;
    assert!(ages.iter().all(Option::is_none), "nothing is known yet");
    assert!(states.iter().all(|s| *s == Ensured::Pending));
    assert_eq!(
        alarms.limiter().calls(),
        std::collections::BTreeMap::default(),
        "no call yet"
    );
    // Within a few seconds every answer is there, from one pass of each.
    let deadline = std::time::Instant::now() + Duration::from_mins(1);
    loop {
        let (ages, states) = round().await;
        let done = ages.iter().all(Option::is_some)
            && states.iter().all(|s| matches!(s, Ensured::InSync { .. }));
        if done {
            for (i, age) in ages.into_iter().enumerate() {
                assert_eq!(age, Some(i64::try_from(i).unwrap() + 1), "queue {i}");
            }
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never read");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        alarms.limiter().calls_of("PutMetricAlarm"),
        0,
        "all in sync"
    );

    // Four intervals of steady state, every consumer reading at each.
    while alarms.counts().0.passes < 5 || alarms.counts().1.passes < 5 {
        let (ages, states) = round().await;
        for (i, age) in ages.into_iter().enumerate() {
            assert_eq!(age, Some(i64::try_from(i).unwrap() + 1), "queue {i}");
        }
        assert!(
            states
                .iter()
                .all(|s| matches!(s, Ensured::InSync { wrote: None, .. }))
        );
        assert!(
            std::time::Instant::now() < deadline + every * 8,
            "passes stopped"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The first pass of each read every key (2 and 2 calls); each pass since, one call: the share
    // read longest ago (a twentieth of the metrics, 30, filled up to 500; of the alarms, 19, filled
    // up to 100).
    let (m, d) = alarms.counts();
    eprintln!("metrics {m:?}, alarms {d:?}");
    assert_eq!(m.max_pass_calls, 2, "{m:?}");
    assert_eq!(
        m.calls,
        m.passes + 1,
        "one GetMetricData a pass after the first: {m:?}"
    );
    assert_eq!(m.keys, 600 + 500 * (m.passes - 1), "{m:?}");
    assert_eq!(d.max_pass_calls, 2, "{d:?}");
    assert_eq!(
        d.calls,
        d.passes + 1,
        "one DescribeAlarms a pass after the first: {d:?}"
    );
    assert_eq!(d.keys, 150 + 100 * (d.passes - 1), "{d:?}");
    // The gate saw those calls (a pass is counted when it starts: one may still be on its way).
    let at_gate =
        alarms.limiter().calls_of("GetMetricData") + alarms.limiter().calls_of("DescribeAlarms");
    assert!(at_gate + 2 >= m.calls + d.calls && at_gate <= m.calls + d.calls);
    for s in &specs {
        writer.delete(&s.name, &owner("u1")).await.unwrap();
    }
}

/// In the background, `ensure` never waits: a missing alarm is put in a task of its own and reported
/// created once read back; a hand edit is put back after the next refresh; a delete waits for a put
/// still running, so the alarm is not created again behind it.
#[tokio::test]
async fn ensure_in_the_background_creates_repairs_and_deletes_without_waiting() {
    let cw = cloudwatch().await;
    let alarms = background(cw.clone(), Duration::from_millis(500));
    let name = common::unique_name("qc-ensure");
    let want = dead_letter_alarm(&name, "orders-dlq", "shop", "orders");
    let until_in_sync = || async {
        for _ in 0..200 {
            match alarms.ensure(&want, &owner("u1")).await {
                Ensured::InSync { wrote, .. } => return wrote,
                Ensured::Pending => tokio::time::sleep(Duration::from_millis(50)).await,
                other => panic!("{other:?}"),
            }
        }
        panic!("never in sync");
    };
    assert_eq!(alarms.ensure(&want, &owner("u1")).await, Ensured::Pending);
    assert_eq!(until_in_sync().await, Some(AlarmWrite::Created));
    assert_eq!(alarms.limiter().calls_of("PutMetricAlarm"), 1);
    assert_eq!(until_in_sync().await, None, "reported once");
    // A hand edit: put back once the refresher has read it (within the 4 s description age).
    let mut drifted = want.clone();
    drifted.threshold = 10.0;
    let fresh = CloudWatchAlarms::new(cw.clone());
    fresh.put(&drifted, &owner("u1")).await.unwrap();
    let mut repaired = false;
    for _ in 0..200 {
        if let Ensured::InSync {
            wrote: Some(AlarmWrite::Updated),
            ..
        } = alarms.ensure(&want, &owner("u1")).await
        {
            repaired = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(repaired, "the hand edit was not put back");
    assert_eq!(fresh.describe(&name).await.unwrap().unwrap().spec, want);
    // Changed again and deleted at once: the delete waits for the put it started.
    let mut moved = want.clone();
    moved.queue_name = "orders-dlq-2".into();
    assert_eq!(alarms.ensure(&moved, &owner("u1")).await, Ensured::Pending);
    assert_eq!(
        alarms.delete(&name, &owner("u1")).await.unwrap(),
        AlarmDeletion::Deleted
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(fresh.describe(&name).await.unwrap(), None, "not recreated");
}
