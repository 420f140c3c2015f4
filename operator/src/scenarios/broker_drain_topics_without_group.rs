//! Scale-down waits for what no group has committed on too: messages of a topic nobody consumes
//! yet, and delayed messages not yet due, would otherwise go with the broker.

use super::broker_scale_down::{settled_brokers, sts_replicas};
use super::{addr, condition, condition_message, stored_broker, NOW_MS};
use crate::controller::broker::reconcile;
use crate::controller::drain::SCHEDULE_TOPIC;
use crate::fixtures::paths;
use std::sync::Arc;

#[tokio::test]
async fn a_topic_without_a_group_holds_the_scale_down_until_someone_reads_it() {
    let (api, admin, ctx) = settled_brokers(3).await;
    // billing consumed orders on qb-2; audit-log holds 20 messages nobody ever committed on.
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(100), None);
    admin.set_topic_queue(&addr(2), ("orders", 0), (0, 100), Some(NOW_MS - 5_000));
    admin.set_topic_queue(&addr(2), ("audit-log", 0), (10, 30), Some(NOW_MS - 5_000));
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("waits");
    assert_eq!(sts_replicas(&api), 3);
    let status = stored_broker(&api).status.unwrap();
    let drain = status.drain.clone().expect("draining");
    assert_eq!(drain.pending_topics, vec!["audit-log"]);
    assert_eq!(drain.messages_without_group, 20);
    assert!(drain.pending_groups.is_empty());
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "Draining".into())
    );
    let message = condition_message(&status.conditions, "Progressing");
    assert!(
        message.contains("20 messages no group has committed on, in audit-log"),
        "{message}"
    );

    // A group starts reading audit-log on qb-2 and catches up.
    admin.set_queue(&addr(2), "auditor", ("audit-log", 0), 30, Some(30), None);
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("drained");
    assert_eq!(sts_replicas(&api), 2);
}

#[tokio::test]
async fn delayed_messages_not_yet_due_hold_the_scale_down() {
    let (api, admin, ctx) = settled_brokers(2).await;
    // Level 18 (two hours): stored a minute ago, due in 119 minutes.
    admin.set_topic_queue(
        &addr(1),
        (SCHEDULE_TOPIC, 17),
        (0, 3),
        Some(NOW_MS - 60_000),
    );
    // Level 1 (one second), stored an hour ago: delivered long since.
    admin.set_topic_queue(
        &addr(1),
        (SCHEDULE_TOPIC, 0),
        (0, 9),
        Some(NOW_MS - 3_600_000),
    );
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 1.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("waits");
    assert_eq!(sts_replicas(&api), 2);
    let drain = stored_broker(&api).status.unwrap().drain.expect("draining");
    assert_eq!(drain.pending_topics, vec![SCHEDULE_TOPIC]);
    assert_eq!(drain.messages_without_group, 0);
}
