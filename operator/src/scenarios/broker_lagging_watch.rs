//! The Broker's status is judged against what the operator last wrote, not against a watch
//! cache that has not caught up with that write yet: a pass on the lagging cache neither skips
//! a write that is due nor writes again what is stored with its transition times moved.

use super::{condition, eventually, holds_for, Scenario};
use crate::crd::Broker;
use crate::testapi::PodBehaviour;
use std::time::Duration;

/// Ready's status and when it last changed, as stored.
fn ready(scenario: &Scenario) -> (String, String) {
    let status = scenario.status();
    let found = status
        .conditions
        .iter()
        .find(|condition| condition.type_ == "Ready")
        .expect("a Ready condition");
    (
        found.status.clone(),
        found.last_transition_time.0.to_string(),
    )
}

#[tokio::test(start_paused = true)]
async fn passes_on_a_lagging_watch_do_not_rewrite_the_status_with_new_times() {
    let scenario = Scenario::settled(3).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    scenario.server.hold_watches::<Broker>();
    scenario
        .server
        .set_pod_behaviour("ns", "qb-1", PodBehaviour::CrashLoop);
    eventually(Duration::from_secs(60), || {
        condition(&scenario.status().conditions, "Ready").0 == "False"
    })
    .await;
    let down = scenario.status();
    let writes_before = scenario
        .server
        .request_count("patch", "brokers", "qb", "status");
    let reconciles_before = scenario.reconciles();

    // The pod stays down: every pass (each requeue while not Ready) finds what is stored. On
    // the cache they would find Ready=True and write Ready=False again, stamped now.
    holds_for(Duration::from_secs(300), "the status as written", || {
        scenario.status() == down
    })
    .await;
    assert!(
        scenario.reconciles() > reconciles_before,
        "passes ran on the lagging cache"
    );
    let writes = scenario
        .server
        .request_count("patch", "brokers", "qb", "status");
    assert_eq!(writes - writes_before, 0, "nothing new to write");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_lagging_watch_neither_hides_a_recovery_nor_rewrites_the_status() {
    let scenario = Scenario::settled(3).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let writes = || {
        scenario
            .server
            .request_count("patch", "brokers", "qb", "status")
    };
    // From here the operator's cache keeps the settled status: its own writes do not come back.
    scenario.server.hold_watches::<Broker>();

    scenario
        .server
        .set_pod_behaviour("ns", "qb-1", PodBehaviour::CrashLoop);
    eventually(Duration::from_secs(60), || {
        condition(&scenario.status().conditions, "Ready").0 == "False"
    })
    .await;
    let (_, went_down) = ready(&scenario);

    // Back up: the stored Ready=False must turn True, though the cache still says True.
    scenario.server.clear_pod_behaviour("ns", "qb-1");
    eventually(Duration::from_secs(60), || scenario.broker_ready()).await;
    let (_, came_back) = ready(&scenario);
    assert!(came_back > went_down, "{came_back} after {went_down}");

    // Later passes on the still lagging cache (the idle requeue) change nothing stored.
    let settled = scenario.status();
    let writes_before = writes();
    holds_for(Duration::from_secs(600), "the status as written", || {
        scenario.status() == settled
    })
    .await;
    assert_eq!(writes() - writes_before, 0, "nothing new to write");

    // The watch catches up: still nothing to write.
    scenario.server.release_watches::<Broker>();
    holds_for(Duration::from_secs(600), "the status as written", || {
        scenario.status() == settled
    })
    .await;
    assert_eq!(writes() - writes_before, 0, "nothing new to write");
    scenario.stop().await;
}
