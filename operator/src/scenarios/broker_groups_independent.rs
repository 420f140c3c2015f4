//! Broker groups do not wait on each other: a crash-looping pod of group 0 holds back neither
//! group 1's start nor its rollout (Parallel pod management, each group's rollout stepped on
//! its own), and after every pod is deleted they all come back at once, not one Ready pod
//! after another.

use super::{addr, eventually, Scenario};
use crate::crd::Broker;
use crate::fixtures::BrokerFixture;
use crate::testapi::PodBehaviour;
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeSet;
use std::time::Duration;

/// True when each of `pods` exists, runs `image` and is Ready.
fn ready_on(scenario: &Scenario, pods: &[&str], image: &str) -> bool {
    let all = scenario.pods();
    pods.iter().all(|pod| {
        all.iter()
            .any(|(name, on, ready)| name == pod && on == image && *ready)
    })
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_pod_of_group_0_does_not_hold_back_group_1s_start() {
    let scenario = Scenario::start(true).await;
    for (group, members) in [(0, [0, 1]), (1, [2, 3])] {
        let members = members.map(addr);
        scenario
            .admin
            .set_replication_group(&format!("qb-g{group}"), &members, 1);
    }
    scenario
        .server
        .set_pod_behaviour("ns", "qb-0", PodBehaviour::CrashLoop);
    let broker = Broker::test()
        .replicas(2)
        .replicated(2, 1)
        .image("quiver:1");
    scenario.create_broker(broker);

    eventually(Duration::from_secs(300), || {
        ready_on(&scenario, &["qb-1", "qb-2", "qb-3"], "quiver:1")
    })
    .await;
    eventually(Duration::from_secs(120), || {
        let status = scenario.status();
        let groups = status.replication.map(|r| r.groups).unwrap_or_default();
        groups
            .iter()
            .any(|group| group.name == "qb-g1" && group.master.as_deref() == Some("qb-2"))
    })
    .await;
    let crashing = scenario.pods();
    assert!(
        crashing
            .iter()
            .any(|(name, _, ready)| name == "qb-0" && !ready),
        "{crashing:?}"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_crash_looping_pod_of_group_0_does_not_hold_back_group_1s_rollout() {
    let scenario = Scenario::settled_replicated(2, 2, 1).await;
    // qb-1, a replica of group 0, crashes from now on, whatever it runs.
    scenario
        .server
        .set_pod_behaviour("ns", "qb-1", PodBehaviour::CrashLoop);
    scenario.set_image("quiver:2");

    eventually(Duration::from_secs(1200), || {
        ready_on(&scenario, &["qb-2", "qb-3"], "quiver:2")
    })
    .await;
    let switchovers = scenario.admin.switchovers();
    assert!(
        switchovers
            .iter()
            .any(|(to, target)| to.0 == addr(2) && *target == 1),
        "group 1 switched over to its updated replica: {switchovers:?}"
    );
    assert!(
        ready_on(&scenario, &["qb-0"], "quiver:1"),
        "group 0's master waits for its replica: {:?}",
        scenario.pods()
    );
    assert_eq!(scenario.admin.in_sync("qb-g0"), [0], "qb-1 runs no broker");

    // The crash ends: group 0 finishes its own rollout.
    scenario.server.clear_pod_behaviour("ns", "qb-1");
    eventually(Duration::from_secs(1200), || {
        scenario.pods_ready_on(4, "quiver:2") && scenario.broker_ready()
    })
    .await;
    assert_eq!(scenario.admin.master("qb-g0"), Some(1));
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn after_every_pod_is_deleted_all_come_back_at_once() {
    let scenario = Scenario::settled(3).await;
    let before: BTreeSet<String> = (0..3)
        .filter_map(|ordinal| scenario.pod_uid(&format!("qb-{ordinal}")))
        .collect();
    assert_eq!(before.len(), 3);
    for ordinal in 0..3 {
        scenario
            .server
            .delete::<Pod>("ns", &format!("qb-{ordinal}"))
            .expect("pod deleted");
    }

    eventually(Duration::from_secs(300), || {
        let pods = scenario.server.list::<Pod>("ns");
        pods.len() == 3
            && pods
                .iter()
                .all(|pod| !before.contains(pod.metadata.uid.as_deref().unwrap_or_default()))
            && scenario.pods_ready_on(3, "quiver:1")
    })
    .await;
    let created: BTreeSet<String> = scenario
        .server
        .list::<Pod>("ns")
        .into_iter()
        .filter_map(|pod| pod.metadata.creation_timestamp)
        .map(|time| time.0.to_string())
        .collect();
    assert_eq!(
        created.len(),
        1,
        "all three created in one pass, not each after the one before was Ready: {created:?}"
    );
    eventually(Duration::from_secs(120), || scenario.broker_ready()).await;
    scenario.stop().await;
}
