//! A group whose in-sync set falls below minInSyncReplicas, or that loses its master, sets
//! ReplicationDegraded (one Warning event) naming the group; it clears when the set recovers.

use super::{condition, condition_message, eventually, Scenario};
use std::time::Duration;

fn degraded(scenario: &Scenario) -> (String, String) {
    condition(&scenario.status().conditions, "ReplicationDegraded")
}

#[tokio::test(start_paused = true)]
async fn a_group_below_its_minimum_is_degraded_until_the_set_recovers() {
    let scenario = Scenario::settled_replicated(2, 3, 2).await;
    assert_eq!(degraded(&scenario), ("False".into(), "InSync".into()));
    scenario.admin.set_in_sync("qb-g1", &[0]);
    // Found on the next idle requeue at the latest.
    eventually(Duration::from_secs(330), || {
        degraded(&scenario) == ("True".into(), "BelowMinInSync".into())
    })
    .await;
    let message = condition_message(&scenario.status().conditions, "ReplicationDegraded");
    assert!(
        message.starts_with("qb-g1 has 1 in sync (qb-3), below minInSyncReplicas 2"),
        "{message}"
    );
    let group = &scenario.status().replication.expect("replication").groups[1];
    assert_eq!(group.in_sync, ["qb-3"]);
    assert!(!group.members[1].in_sync);
    assert_eq!(group.members[1].lag_bytes, Some(3072));
    tokio::time::sleep(Duration::from_secs(90)).await;
    assert_eq!(
        scenario.events("ReplicationDegraded").len(),
        1,
        "no repeated warning"
    );
    scenario.event("ReplicationDegraded", "Warning");

    scenario.admin.set_in_sync("qb-g1", &[0, 1, 2]);
    // Checked every 30 s while degraded.
    eventually(Duration::from_secs(40), || {
        degraded(&scenario) == ("False".into(), "InSync".into())
    })
    .await;
    scenario.event("ReplicationRecovered", "Normal");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_group_without_a_master_is_degraded() {
    let scenario = Scenario::settled_replicated(1, 3, 2).await;
    scenario.admin.set_master("qb-g0", None);
    eventually(Duration::from_secs(330), || {
        degraded(&scenario) == ("True".into(), "NoMaster".into())
    })
    .await;
    let message = condition_message(&scenario.status().conditions, "ReplicationDegraded");
    assert!(
        message.contains("qb-g0 has no master (epoch 2)"),
        "{message}"
    );
    let group = &scenario.status().replication.expect("replication").groups[0];
    assert_eq!(group.master, None);
    assert!(group.members.iter().all(|m| m.role == "Unknown"));
    scenario.admin.set_master("qb-g0", Some(2));
    eventually(Duration::from_secs(40), || {
        degraded(&scenario) == ("False".into(), "InSync".into())
    })
    .await;
    assert_eq!(
        scenario.status().replication.expect("replication").groups[0]
            .master
            .as_deref(),
        Some("qb-2")
    );
    scenario.stop().await;
}
