//! A replicated group's drain counts the group once, on its master: scaling two groups of two
//! down to one measures the leaving group's master (qb-3 after a failover), not the sum of its
//! members, and completes when the master's figures say everything was read, whatever its
//! trailing replica reports.

use super::{addr, eventually, Scenario, NOW_MS};
use crate::admin::BrokerPermission;
use crate::crd::DrainWait;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_replicated_group_is_counted_once_on_its_master() {
    let scenario = Scenario::settled_replicated(2, 2, 1).await;
    let admin = &scenario.admin;
    // Group qb-g1 is qb-2 (replica 0) and qb-3 (replica 1), master since a failover.
    admin.set_master("qb-g1", 1);
    for ordinal in [2, 3] {
        admin.set_topic_queue(
            &addr(ordinal),
            ("orders", 0),
            (0, 100),
            Some(NOW_MS - 5_000),
        );
    }
    // billing committed 40 on the master; the replica's copy of its offsets trails at 20.
    admin.set_queue(&addr(3), "billing", ("orders", 0), 100, Some(40), None);
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(20), None);
    scenario.scale_to(1);

    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    let drain = scenario.status().drain.expect("draining");
    assert_eq!(drain.brokers, ["qb-2", "qb-3"]);
    let on_the_master = DrainWait {
        topic: "orders".into(),
        group: Some("billing".into()),
        unread: 60,
    };
    assert_eq!(
        (drain.remaining_messages, drain.waiting_for),
        (60, vec![on_the_master]),
        "the master's figures, once"
    );
    for ordinal in [2, 3] {
        assert_eq!(
            admin.permission(&addr(ordinal)),
            Some(BrokerPermission::ReadOnly),
            "every member fenced"
        );
    }

    // billing reads to the end on the master: the group goes, though the replica trails.
    admin.consume_all(&addr(3), "billing");
    eventually(Duration::from_secs(300), || {
        scenario.sts_replicas() == 2 && scenario.status().drain.is_none()
    })
    .await;
    scenario.event("Drained", "Normal");
    scenario.stop().await;
}
