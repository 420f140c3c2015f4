//! A scale-down reverted half-way (5 -> 2, then 3 mid-drain): the broker that stays becomes
//! writable again at once, the two still leaving keep draining, and the StatefulSet ends at 3.

use super::{addr, eventually, Scenario};
use crate::admin::BrokerPermission;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn the_kept_broker_is_writable_again_and_the_others_drain() {
    let scenario = Scenario::settled(5).await;
    let admin = &scenario.admin;
    for ordinal in 2..5 {
        admin.set_queue(
            &addr(ordinal),
            "billing",
            ("orders", 0),
            100,
            Some(40),
            None,
        );
    }
    scenario.scale_to(2);
    eventually(Duration::from_secs(60), || {
        scenario.status().read_only_brokers == ["qb-2", "qb-3", "qb-4"]
    })
    .await;
    for ordinal in 2..5 {
        assert_eq!(
            admin.permission(&addr(ordinal)),
            Some(BrokerPermission::ReadOnly)
        );
    }

    scenario.scale_to(3);
    eventually(Duration::from_secs(60), || {
        scenario
            .status()
            .drain
            .is_some_and(|drain| drain.brokers == ["qb-3", "qb-4"])
    })
    .await;
    assert_eq!(
        admin.permission(&addr(2)),
        Some(BrokerPermission::ReadWrite),
        "qb-2 stays, so it takes writes again"
    );
    let status = scenario.status();
    assert_eq!(status.read_only_brokers, ["qb-3", "qb-4"]);
    assert_eq!(
        status.drain.map(|drain| drain.remaining_messages),
        Some(120)
    );
    assert_eq!(
        scenario.sts_replicas(),
        5,
        "qb-3 and qb-4 still hold unread messages"
    );
    scenario.event("DrainCancelled", "Normal");

    admin.consume_all(&addr(3), "billing");
    admin.consume_all(&addr(4), "billing");
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 3
            && scenario.pods_ready_on(3, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    let status = scenario.status();
    assert_eq!(status.drain, None);
    assert!(status.read_only_brokers.is_empty());
    assert_eq!(
        admin.permission(&addr(2)),
        Some(BrokerPermission::ReadWrite)
    );
    scenario.stop().await;
}
