//! Two members claim master: the one deposed while cut off still answers as the master of its
//! old epoch. The group's status names the newest epoch's master, whichever answers first.

use super::{eventually, holds_for, Scenario};
use crate::crd::ReplicationGroupStatus;
use std::time::Duration;

fn group(scenario: &Scenario) -> Option<ReplicationGroupStatus> {
    scenario
        .status()
        .replication
        .and_then(|replication| replication.groups.first().cloned())
}

fn master_and_epoch(scenario: &Scenario) -> Option<(String, u64)> {
    let group = group(scenario)?;
    Some((group.master?, group.epoch?))
}

#[tokio::test(start_paused = true)]
async fn the_group_status_names_the_newest_epochs_master() {
    let scenario = Scenario::settled_replicated(1, 3, 1).await;
    assert_eq!(master_and_epoch(&scenario), Some(("qb-0".into(), 1)));

    // qb-1 is elected at epoch 2 while qb-0, cut off, still believes it leads epoch 1; qb-0
    // answers first (the lowest ordinal).
    scenario.admin.set_master("qb-g0", 1);
    scenario.admin.answer_as_deposed_master("qb-g0", 0, 1);
    let newest = Some(("qb-1".to_string(), 2));
    eventually(Duration::from_secs(900), || {
        master_and_epoch(&scenario) == newest
    })
    .await;
    let roles: Vec<(String, String)> = group(&scenario)
        .expect("group status")
        .members
        .into_iter()
        .map(|member| (member.pod, member.role))
        .collect();
    assert_eq!(
        roles,
        [
            ("qb-0".to_string(), "Replica".to_string()),
            ("qb-1".to_string(), "Master".to_string()),
            ("qb-2".to_string(), "Replica".to_string()),
        ]
    );
    holds_for(
        Duration::from_secs(600),
        "the status stays on the newest epoch's master",
        || master_and_epoch(&scenario) == newest,
    )
    .await;
    scenario.stop().await;
}
