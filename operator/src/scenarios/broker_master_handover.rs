//! A pod deletion of a master triggers a switchover first: the stuck-pod repair, which deletes
//! an outdated pod that is not Ready at once, asks the group's master to hand over before it
//! deletes the master's pod (the executor's calls in order; each pass's decision is a row of
//! controller::broker::tests::membership_rows).

use super::{addr, eventually, Scenario};
use crate::testapi::PodBehaviour;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_stuck_master_pod_is_deleted_only_after_a_switchover() {
    let scenario = Scenario::settled_replicated(1, 3, 2).await;
    // The master's pod stops being Ready (its readiness probe fails; its broker still runs and
    // answers as master), then a template change leaves it outdated: the stuck-pod repair's
    // case.
    scenario
        .server
        .set_pod_behaviour("ns", "qb-0", PodBehaviour::Unready);
    scenario.set_image("quiver:2");
    eventually(Duration::from_secs(600), || {
        scenario.pod_delete_index("qb-0").is_some()
    })
    .await;
    scenario.server.clear_pod_behaviour("ns", "qb-0");
    let deleted_at = scenario.pod_delete_index("qb-0").expect("deleted");
    let calls = scenario.admin.replication_calls();
    let first = calls.first().expect("a switchover was asked for");
    assert_eq!(
        (first.addr.0.as_str(), first.what.as_str()),
        (addr(0).as_str(), "switchover to 1"),
        "asked of the master, to an in-sync replica whose pod is up: {calls:?}"
    );
    assert!(
        first.api_requests_before <= deleted_at,
        "the switchover ({}) came before the delete of qb-0 ({deleted_at})",
        first.api_requests_before
    );
    assert_eq!(scenario.admin.master("qb-g0"), Some(1));
    let switched = scenario.event("Switchover", "Normal");
    assert!(
        switched["note"]
            .as_str()
            .is_some_and(|note| note.ends_with("before deleting qb-0")),
        "{switched}"
    );
    scenario.event("StuckPodDeleted", "Warning");
    eventually(Duration::from_secs(1200), || {
        scenario.pods_ready_on(3, "quiver:2") && scenario.broker_ready()
    })
    .await;
    scenario.stop().await;
}
