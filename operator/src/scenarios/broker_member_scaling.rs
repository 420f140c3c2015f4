//! A `spec.replication.replicas` change rolls only what it must: 2 -> 3 starts a third pod and
//! adds it to the group's membership, 3 -> 2 switches the master away from the member to
//! remove, removes it, then its pod goes; no other pod is deleted or restarted. Each pass's
//! decision is a row of controller::broker::tests::membership_rows.

use super::{addr, eventually, holds_for, Scenario};
use std::time::Duration;

fn set_group_size(scenario: &Scenario, size: i32) {
    scenario.edit_broker(|broker| broker["spec"]["replication"]["replicas"] = size.into());
}

/// What the operator asked of the brokers from call `from` on: (address, call).
fn calls_from(scenario: &Scenario, from: usize) -> Vec<(String, String)> {
    scenario.admin.replication_calls()[from..]
        .iter()
        .map(|call| (call.addr.0.clone(), call.what.clone()))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_group_size_change_adds_and_removes_a_member_and_restarts_no_other() {
    let scenario = Scenario::settled_replicated(1, 2, 1).await;
    let uids = |scenario: &Scenario| ["qb-0", "qb-1"].map(|pod| scenario.pod_uid(pod));
    let before = uids(&scenario);
    assert!(before.iter().all(Option::is_some), "{before:?}");

    scenario.admin.start_joining("qb-g0", 2, &addr(2));
    set_group_size(&scenario, 3);
    eventually(Duration::from_secs(600), || {
        scenario.admin.group_members("qb-g0") == [0, 1, 2]
            && scenario.pods_ready_on(3, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    assert_eq!(
        calls_from(&scenario, 0),
        [(addr(0), "add 2".to_string())],
        "one add, asked of the master"
    );
    scenario.event("MemberAdded", "Normal");

    // Mastership on the member to remove: it must be switched away before the removal.
    scenario.admin.set_master("qb-g0", 2);
    let asked = scenario.admin.replication_calls().len();
    set_group_size(&scenario, 2);
    let mut member_pod_gone = false;
    eventually(Duration::from_secs(600), || {
        let member = scenario.admin.group_members("qb-g0").contains(&2);
        member_pod_gone |= member && scenario.pod_uid("qb-2").is_none();
        !member && scenario.pods_ready_on(2, "quiver:1") && scenario.broker_ready()
    })
    .await;
    assert!(!member_pod_gone, "qb-2's pod went before its removal");
    assert_eq!(
        calls_from(&scenario, asked),
        [
            (addr(2), "switchover to 0".to_string()),
            (addr(0), "remove 2".to_string()),
        ],
        "the master switched away first, then the removal asked of the new master"
    );
    assert_eq!(scenario.sts_replicas(), 2);
    scenario.event("MemberRemoved", "Normal");

    assert_eq!(uids(&scenario), before, "qb-0 and qb-1 never restarted");
    for pod in ["qb-0", "qb-1"] {
        assert_eq!(scenario.pod_delete_index(pod), None, "{pod} deleted");
    }
    holds_for(Duration::from_secs(60), "a settled group", || {
        scenario.admin.replication_calls().len() == asked + 2 && scenario.broker_ready()
    })
    .await;
    scenario.stop().await;
}
