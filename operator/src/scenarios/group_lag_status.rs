//! A ConsumerGroup is created on its brokers and gets its lag in status and metrics; a missing
//! Broker is reported and retried; a group without commits shows unknown lag, not zero; the
//! group is upserted on the brokers only when needed.

use super::group_support::{GroupScenario, FIRST_POLL, NEXT_POLL, POLL_SUCCESS};
use super::{addr, eventually, holds_for, LAG_INTERVAL};
use crate::controller::group::{FINALIZER, MISSING_BROKER_REQUEUE};
use crate::crd::LagThresholds;
use crate::testapi::sim_clock;
use std::time::Duration;
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn lag_lands_in_status_and_metrics() {
    let scenario = GroupScenario::start().await;
    let admin = &scenario.admin;
    let stored_at = seed_lagging_group(&scenario);

    let first_poll = Instant::now();
    eventually(FIRST_POLL, || scenario.polled()).await;
    let age_now = assert_first_poll(&scenario, stored_at);
    assert_lag_metrics(&scenario, age_now);

    // No commit for the whole 60 s window while lagging: Stalled, not before.
    eventually(Duration::from_secs(150), || {
        scenario.condition("Stalled").0 == "True"
    })
    .await;
    let took = first_poll.elapsed();
    assert!(
        (Duration::from_secs(60)..Duration::from_secs(60) + 3 * LAG_INTERVAL).contains(&took),
        "Stalled after {took:?}"
    );
    assert_eq!(
        scenario.condition("Stalled"),
        ("True".into(), "CommitsNotMoving".into())
    );
    assert_eq!(
        scenario.condition("Consuming"),
        ("False".into(), "Stalled".into())
    );
    assert!(scenario.metrics().contains(
        r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 1"#
    ));
    scenario.event("Stalled", "Warning");

    // The group commits: within an interval no longer stalled, last commit time recorded.
    admin.consume_all(&addr(0), "billing");
    eventually(NEXT_POLL, || scenario.status().total_lag == Some(0)).await;
    assert_eq!(scenario.condition("Stalled").0, "False");
    assert_eq!(scenario.condition("Lagging").0, "False");
    assert_eq!(
        scenario.condition("Consuming"),
        ("True".into(), "CaughtUp".into())
    );
    assert!(scenario.status().last_commit_time.is_some());
    scenario.stop().await;
}

/// Queues of two brokers, one member, a topic outside the spec, and the group (threshold 5
/// messages, 60 s window); returns when the lagging message was stored.
fn seed_lagging_group(scenario: &GroupScenario) -> i64 {
    let admin = &scenario.admin;
    let stored_at = sim_clock() - 5_000;
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        100,
        Some(90),
        Some(stored_at),
    );
    admin.set_queue(&addr(0), "billing", ("orders", 1), 50, None, None);
    admin.set_queue(&addr(1), "billing", ("orders", 0), 10, Some(10), None);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    admin.set_members(&addr(1), "billing", &["10.0.0.7@1"]);
    let other = ("other-topic", 0);
    admin.set_queue(&addr(1), "billing", other, 10, Some(0), Some(stored_at));
    scenario.create_group(|group| {
        group.spec.lag_thresholds = Some(LagThresholds {
            messages: Some(5),
            window_seconds: Some(60),
            ..LagThresholds::default()
        });
    });
    stored_at
}

/// The first poll's status: the group on every broker, lag of spec topics only, latency, top
/// queues, members once, the conditions; returns the message's age now, in seconds.
fn assert_first_poll(scenario: &GroupScenario, stored_at: i64) -> f64 {
    let admin = &scenario.admin;
    let group = scenario.group();
    assert_eq!(group.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    for ordinal in 0..2 {
        let config = admin
            .group(&addr(ordinal), "billing")
            .expect("group ensured on every broker");
        let configured = (config.max_reconsume_times, config.consume_enable);
        assert_eq!(configured, (16, true));
    }
    let status = scenario.status();
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(
        status.total_lag,
        Some(10),
        "only spec topics, committed queues"
    );
    let lag_seconds = status.lag_seconds.expect("latency known");
    // The message's age when polled: 5 s at the start, at most its age now.
    let age_now = (sim_clock() - stored_at) as f64 / 1000.0;
    assert!(
        (5.0..=age_now).contains(&lag_seconds),
        "{lag_seconds} of {age_now}"
    );
    assert_eq!(status.topics.len(), 1);
    assert_eq!(status.topics[0].uncommitted_queues, 1);
    assert_eq!(status.top_queues.len(), 1);
    let top = &status.top_queues[0];
    assert_eq!(
        (top.broker.as_str(), top.queue_id, top.lag),
        ("qb-0", 0, 10)
    );
    assert_eq!(
        status.members,
        Some(1),
        "members counted once across brokers"
    );
    let ready = scenario.message("Ready");
    assert!(ready.contains("1 live members"), "{ready}");
    let pairs = [
        ("Ready", "True", "GroupConfigured"),
        ("Lagging", "True", "ThresholdExceeded"),
        ("Stalled", "False", "Progressing"),
        ("Consuming", "True", "Progressing"),
    ];
    for (type_, status, reason) in pairs {
        assert_eq!(scenario.condition(type_), (status.into(), reason.into()));
    }
    age_now
}

/// The first poll's series: lag, queue lag, stalled, status, poll success and latency.
fn assert_lag_metrics(scenario: &GroupScenario, age_now: f64) {
    let metrics = scenario.metrics();
    for expected in [
        r#"rocketmq_consumer_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="orders"} 10"#,
        r#"quiver_consumer_queue_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-0",queue_id="0"} 10"#,
        r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 0"#,
        r#"quiver_consumer_group_status{namespace="ns",cluster="qb",consumer_group="billing",status="ok"} 1"#,
        &format!("{POLL_SUCCESS} 1"),
    ] {
        assert!(
            metrics.contains(expected),
            "missing {expected} in\n{metrics}"
        );
    }
    let latency_ms: f64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix(r#"rocketmq_consumer_lag_latency{namespace="ns",cluster="qb",consumer_group="billing",topic="orders"} "#))
        .expect("latency series")
        .parse()
        .expect("a number");
    assert!(
        (5_000.0..=age_now * 1000.0).contains(&latency_ms),
        "{latency_ms} of {age_now} s"
    );
    assert!(
        !metrics.contains(r#"queue_id="1""#),
        "uncommitted queue has no series"
    );
}

#[tokio::test(start_paused = true)]
async fn a_missing_broker_is_reported_then_retried() {
    let mut scenario = GroupScenario::without_broker().await;
    scenario.start_operator();
    scenario.create_group(|_| {});
    eventually(FIRST_POLL, || {
        scenario.condition("Ready") == ("False".into(), "BrokerNotFound".into())
    })
    .await;
    assert_eq!(
        scenario.condition("Consuming"),
        ("Unknown".into(), "BrokerNotFound".into())
    );
    assert_eq!(scenario.status().total_lag, None);
    scenario.event("BrokerNotFound", "Warning");
    assert!(scenario.metrics().contains(&format!("{POLL_SUCCESS} 0")));

    // Created later: picked up on the retry, without any change to the group.
    let created = Instant::now();
    scenario.create_broker();
    scenario
        .admin
        .set_queue(&addr(0), "billing", ("orders", 0), 10, Some(10), None);
    eventually(MISSING_BROKER_REQUEUE + Duration::from_secs(15), || {
        scenario.polled()
    })
    .await;
    let took = created.elapsed();
    assert!(
        took <= MISSING_BROKER_REQUEUE + Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(scenario.status().total_lag, Some(0));
    assert!(scenario.metrics().contains(&format!("{POLL_SUCCESS} 1")));
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_group_without_commits_shows_unknown_lag_not_zero() {
    let scenario = GroupScenario::start().await;
    let topic = crate::admin::TopicConfig {
        name: "orders".into(),
        queues: 4,
    };
    for ordinal in 0..2 {
        let addr = crate::admin::BrokerAddr(addr(ordinal));
        crate::admin::BrokerAdmin::create_topic(scenario.admin.as_ref(), &addr, &topic)
            .await
            .expect("topic created");
    }
    scenario.create_group(|group| {
        group.spec.consume_from_where = crate::crd::ConsumeFromWhere::ConsumeFromFirstOffset;
    });
    eventually(FIRST_POLL, || scenario.polled()).await;
    let config = scenario.admin.group(&addr(0), "billing").expect("ensured");
    assert!(
        config.consume_from_min_enable,
        "first offset maps to consumeFromMinEnable"
    );
    let status = scenario.status();
    assert_eq!(status.total_lag, None, "unknown, not zero");
    assert_eq!(status.lag_seconds, None);
    assert_eq!(status.topics.len(), 1);
    assert_eq!(status.topics[0].lag, None);
    assert_eq!(
        status.topics[0].uncommitted_queues, 8,
        "4 queues on 2 brokers"
    );
    assert_eq!(scenario.condition("Lagging").0, "False");
    assert_eq!(
        scenario.condition("Consuming"),
        ("Unknown".into(), "LagUnknown".into())
    );
    let metrics = scenario.metrics();
    assert!(
        !metrics.contains("rocketmq_consumer_lag_messages{"),
        "{metrics}"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_group_is_upserted_only_when_needed() {
    let scenario = GroupScenario::start().await;
    scenario.create_group(|_| {});
    eventually(FIRST_POLL, || scenario.polled()).await;
    assert_eq!(scenario.admin.upserts(), 2, "created on both brokers");
    let polls = scenario.polls();
    holds_for(3 * LAG_INTERVAL, "no upsert on a lag poll", || {
        scenario.admin.upserts() == 2
    })
    .await;
    assert!(scenario.polls() >= polls + 2, "polled meanwhile");

    scenario.admin.forget_group(&addr(1), "billing");
    eventually(NEXT_POLL, || scenario.admin.upserts() == 3).await;
    assert!(
        scenario.admin.group(&addr(1), "billing").is_some(),
        "recreated"
    );

    // A new spec goes to every broker at once, not at the next interval.
    scenario.edit_group(|group| group["spec"]["maxReconsumeTimes"] = 3.into());
    eventually(Duration::from_secs(10), || scenario.admin.upserts() == 5).await;
    let config = scenario.admin.group(&addr(0), "billing").unwrap();
    assert_eq!(config.max_reconsume_times, 3);
    eventually(Duration::from_secs(10), || {
        scenario.status().observed_generation == Some(2)
    })
    .await;
    holds_for(2 * LAG_INTERVAL, "no upsert after", || {
        scenario.admin.upserts() == 5
    })
    .await;
    scenario.stop().await;
}
