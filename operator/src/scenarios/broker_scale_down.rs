//! Scale-down drain, topics without groups included: the leaving broker turns read-only, the
//! status lists the groups and the topics still to be read, the StatefulSet keeps its replicas
//! until everything is consumed, then scales down.

use super::{addr, condition, eventually, holds_for, Scenario, NOW_MS};
use crate::admin::BrokerPermission;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn the_statefulset_keeps_the_leaving_broker_until_groups_and_topics_are_read() {
    let scenario = Scenario::settled(3).await;
    let admin = &scenario.admin;
    // On qb-2: billing has 60 unread messages of orders; audit-log holds 20 that no group has
    // ever committed on.
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    admin.set_topic_queue(&addr(2), ("orders", 0), (0, 100), Some(NOW_MS - 5_000));
    admin.set_topic_queue(&addr(2), ("audit-log", 0), (10, 30), Some(NOW_MS - 5_000));
    scenario.scale_to(2);

    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    let status = scenario.status();
    let drain = status.drain.clone().expect("draining");
    assert_eq!(drain.brokers, ["qb-2"]);
    assert_eq!(drain.pending_groups, ["billing"]);
    assert_eq!(drain.pending_topics, ["audit-log"]);
    assert_eq!(drain.messages_without_group, 20);
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "Draining".into())
    );
    assert_eq!(admin.permission(&addr(2)), Some(BrokerPermission::ReadOnly));
    assert_eq!(
        admin.permission(&addr(1)),
        None,
        "staying brokers untouched"
    );
    scenario.event("DrainStarted", "Normal");
    holds_for(
        Duration::from_secs(180),
        "three brokers while draining",
        || scenario.sts_replicas() == 3 && scenario.pods().len() == 3,
    )
    .await;

    // billing catches up; the groups are gone from the drain, the topic still holds it.
    admin.consume_all(&addr(2), "billing");
    eventually(Duration::from_secs(60), || {
        scenario
            .status()
            .drain
            .is_some_and(|drain| drain.pending_groups.is_empty())
    })
    .await;
    assert_eq!(scenario.sts_replicas(), 3, "audit-log is still unread");

    // A new group reads audit-log on qb-2 to the end: nothing is left, the broker goes.
    admin.set_queue(&addr(2), "auditor", ("audit-log", 0), 30, Some(30), None);
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 2
            && scenario.pods_ready_on(2, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    scenario.event("Drained", "Normal");
    let status = scenario.status();
    assert_eq!((status.drain, status.current_replicas), (None, 2));
    scenario.stop().await;
}
