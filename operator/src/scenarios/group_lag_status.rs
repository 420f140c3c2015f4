//! A ConsumerGroup is created on its brokers and gets its lag in status and metrics.

use super::group_support::{poll_after, simulated_context, two_brokers};
use super::{addr, condition, context, stored_group, LAG_INTERVAL, NOW_MS};
use crate::controller::group::{reconcile, FINALIZER, MISSING_BROKER_REQUEUE};
use crate::crd::{ConsumerGroup, LagThresholds};
use crate::fixtures::{paths, FakeAdmin, FakeApiServer, GroupFixture};
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

#[tokio::test]
async fn lag_lands_in_status_and_metrics() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    two_brokers(&api);
    let mut group = ConsumerGroup::test();
    group.spec.lag_thresholds = Some(LagThresholds {
        messages: Some(5),
        window_seconds: Some(60),
        ..LagThresholds::default()
    });
    api.insert(&paths::group("billing"), &group);
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        100,
        Some(90),
        Some(NOW_MS - 5_000),
    );
    admin.set_queue(&addr(0), "billing", ("orders", 1), 50, None, None);
    admin.set_queue(&addr(1), "billing", ("orders", 0), 10, Some(10), None);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    admin.set_members(&addr(1), "billing", &["10.0.0.7@1"]);
    admin.set_queue(
        &addr(1),
        "billing",
        ("other-topic", 0),
        10,
        Some(0),
        Some(NOW_MS),
    );

    let action = reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("adds the finalizer");
    assert_eq!(action, Action::await_change());
    assert_eq!(
        stored_group(&api).metadata.finalizers,
        Some(vec![FINALIZER.to_string()])
    );

    let action = reconcile(Arc::new(stored_group(&api)), ctx.clone())
        .await
        .expect("collects lag");
    assert_eq!(action, Action::requeue(LAG_INTERVAL));
    for ordinal in 0..2 {
        let config = admin
            .group(&addr(ordinal), "billing")
            .expect("group ensured on every broker");
        assert_eq!(
            (config.max_reconsume_times, config.consume_enable),
            (16, true)
        );
    }
    let status = stored_group(&api).status.expect("status written");
    assert_eq!(
        status.total_lag,
        Some(10),
        "only spec topics, only committed queues"
    );
    assert_eq!(status.lag_seconds, Some(5.0));
    assert_eq!(status.topics.len(), 1);
    assert_eq!(status.topics[0].uncommitted_queues, 1);
    assert_eq!(status.top_queues.len(), 1);
    assert_eq!(
        (
            status.top_queues[0].broker.as_str(),
            status.top_queues[0].queue_id,
            status.top_queues[0].lag
        ),
        ("qb-0", 0, 10)
    );
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("True".into(), "GroupConfigured".into())
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(
        status.members,
        Some(1),
        "members counted once across brokers"
    );
    assert!(
        ready.message.contains("1 live members"),
        "members counted once across brokers: {}",
        ready.message
    );
    assert_eq!(
        condition(&status.conditions, "Lagging"),
        ("True".into(), "ThresholdExceeded".into())
    );
    assert_eq!(condition(&status.conditions, "Stalled").0, "False");
    assert_eq!(
        condition(&status.conditions, "Consuming"),
        ("True".into(), "Progressing".into())
    );

    let metrics = ctx.metrics.encode();
    for expected in [
        r#"rocketmq_consumer_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="orders"} 10"#,
        r#"rocketmq_consumer_lag_latency{namespace="ns",cluster="qb",consumer_group="billing",topic="orders"} 5000"#,
        r#"quiver_consumer_queue_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-0",queue_id="0"} 10"#,
        r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 0"#,
        r#"quiver_consumer_group_status{namespace="ns",cluster="qb",consumer_group="billing",status="ok"} 1"#,
        r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"} 1"#,
    ] {
        assert!(
            metrics.contains(expected),
            "missing {expected} in\n{metrics}"
        );
    }
    assert!(
        !metrics.contains(r#"queue_id="1""#),
        "uncommitted queue has no series:\n{metrics}"
    );

    // No commit for the whole 60 s window while lagging: Stalled.
    poll_after(&api, &ctx, Duration::from_secs(30))
        .await
        .expect("polls");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Stalled").0,
        "False",
        "30 s only"
    );
    poll_after(&api, &ctx, Duration::from_secs(30))
        .await
        .expect("polls");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Stalled"),
        ("True".into(), "CommitsNotMoving".into())
    );
    assert_eq!(
        condition(&status.conditions, "Consuming"),
        ("False".into(), "Stalled".into())
    );
    assert!(ctx.metrics.encode().contains(
        r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 1"#
    ));
    assert_eq!(api.event_reasons(), vec!["Stalled"]);

    // The group commits: no longer stalled, last commit time recorded.
    admin.consume_all(&addr(0), "billing");
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(status.total_lag, Some(0));
    assert_eq!(condition(&status.conditions, "Stalled").0, "False");
    assert_eq!(condition(&status.conditions, "Lagging").0, "False");
    assert_eq!(
        condition(&status.conditions, "Consuming"),
        ("True".into(), "CaughtUp".into())
    );
    assert!(status.last_commit_time.is_some());
}

#[tokio::test]
async fn missing_broker_is_reported_and_retried() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    api.insert(&paths::group("billing"), &group);
    let action = reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(action, Action::requeue(MISSING_BROKER_REQUEUE));
    let status = stored_group(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("False".into(), "BrokerNotFound".into())
    );
    assert_eq!(
        condition(&status.conditions, "Consuming"),
        ("Unknown".into(), "BrokerNotFound".into())
    );
    assert_eq!(status.total_lag, None);
    assert_eq!(api.event_reasons(), vec!["BrokerNotFound"]);
    assert!(ctx.metrics.encode().contains(
        r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"} 0"#
    ));
}

#[tokio::test]
async fn a_group_without_commits_shows_unknown_lag_not_zero() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    two_brokers(&api);
    let topic = crate::admin::TopicConfig {
        name: "orders".into(),
        queues: 4,
    };
    for ordinal in 0..2 {
        let addr = crate::admin::BrokerAddr(addr(ordinal));
        crate::admin::BrokerAdmin::create_topic(admin.as_ref(), &addr, &topic)
            .await
            .expect("topic created");
    }
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    group.spec.consume_from_where = crate::crd::ConsumeFromWhere::ConsumeFromFirstOffset;
    api.insert(&paths::group("billing"), &group);

    reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("polls");
    let config = admin.group(&addr(0), "billing").expect("group ensured");
    assert!(
        config.consume_from_min_enable,
        "first offset maps to consumeFromMinEnable"
    );
    let status = stored_group(&api).status.unwrap();
    assert_eq!(status.total_lag, None, "unknown, not zero");
    assert_eq!(status.lag_seconds, None);
    assert_eq!(status.topics.len(), 1);
    assert_eq!(status.topics[0].lag, None);
    assert_eq!(
        status.topics[0].uncommitted_queues, 8,
        "4 queues on each of 2 brokers"
    );
    assert_eq!(condition(&status.conditions, "Lagging").0, "False");
    assert!(
        !ctx.metrics
            .encode()
            .contains("rocketmq_consumer_lag_messages{"),
        "no series"
    );
}

#[tokio::test]
async fn the_group_is_upserted_only_when_needed() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    two_brokers(&api);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    api.insert(&paths::group("billing"), &group);

    reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("first poll");
    assert_eq!(admin.upserts(), 2, "created on both brokers");
    poll_after(&api, &ctx, LAG_INTERVAL)
        .await
        .expect("second poll");
    assert_eq!(admin.upserts(), 2, "a lag poll does not rewrite the group");

    admin.forget_group(&addr(1), "billing");
    poll_after(&api, &ctx, LAG_INTERVAL)
        .await
        .expect("third poll");
    assert_eq!(admin.upserts(), 3, "recreated where it went missing");

    api.edit(&paths::group("billing"), |group| {
        group["spec"]["maxReconsumeTimes"] = 3.into();
        group["metadata"]["generation"] = 2.into();
    });
    reconcile(Arc::new(stored_group(&api)), ctx)
        .await
        .expect("spec change");
    assert_eq!(admin.upserts(), 5, "a new spec goes to every broker");
    assert_eq!(
        admin
            .group(&addr(0), "billing")
            .unwrap()
            .max_reconsume_times,
        3
    );
}
