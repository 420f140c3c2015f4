//! A rollout to an image that never becomes Ready: the StatefulSet (OrderedReady) waits on the
//! crash-looping pod forever, so after spec.progressDeadlineSeconds the Broker is Degraded
//! (ProgressDeadlineExceeded, Warning event). Editing the CR is enough to recover, with a third
//! image or with the previous good one (whose revision the StatefulSet reuses, so update and
//! current revision are equal): the operator deletes the pod stuck at the bad revision.

use super::{condition, eventually, Scenario};
use crate::testapi::PodBehaviour;
use std::time::Duration;

const DEADLINE_SECONDS: i64 = 120;

/// Three brokers on quiver:1 rolled to quiver:bad: qb-2 crash-loops, qb-0 and qb-1 keep
/// serving, and the Broker is Degraded once the deadline passes.
async fn stuck_on_a_bad_image() -> Scenario {
    let scenario = Scenario::settled(3).await;
    scenario
        .server
        .set_image_behaviour("quiver:bad", PodBehaviour::CrashLoop);
    scenario.edit_broker(|broker| {
        broker["spec"]["image"] = "quiver:bad".into();
        broker["spec"]["progressDeadlineSeconds"] = DEADLINE_SECONDS.into();
    });
    eventually(Duration::from_secs(600), || {
        condition(&scenario.status().conditions, "Degraded")
            == ("True".into(), "ProgressDeadlineExceeded".into())
    })
    .await;
    scenario.event("ProgressDeadlineExceeded", "Warning");
    let pods = scenario.pods();
    assert_eq!(
        pods,
        [
            ("qb-0".into(), "quiver:1".into(), true),
            ("qb-1".into(), "quiver:1".into(), true),
            ("qb-2".into(), "quiver:bad".into(), false),
        ],
        "only the highest ordinal tried the bad image"
    );
    assert!(
        scenario.events("StuckPodDeleted").is_empty(),
        "a pod at the update revision is a spec problem: left alone"
    );
    scenario
}

/// After the fix: every pod Ready on `image`, the stuck pod deleted by the operator, not
/// Degraded.
async fn recovers_to(scenario: &Scenario, image: &str) {
    eventually(Duration::from_secs(900), || {
        scenario.pods_ready_on(3, image) && scenario.broker_ready()
    })
    .await;
    let deleted = scenario.event("StuckPodDeleted", "Warning");
    assert!(
        deleted["note"]
            .as_str()
            .unwrap_or_default()
            .contains("qb-2"),
        "{deleted}"
    );
    let status = scenario.status();
    assert_eq!(condition(&status.conditions, "Degraded").0, "False");
    assert_eq!(
        status.observed_generation,
        scenario.broker().metadata.generation
    );
}

#[tokio::test(start_paused = true)]
async fn a_third_image_recovers_without_a_manual_pod_delete() {
    let scenario = stuck_on_a_bad_image().await;
    scenario.set_image("quiver:3");
    recovers_to(&scenario, "quiver:3").await;
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_previous_good_image_recovers_without_a_manual_pod_delete() {
    let scenario = stuck_on_a_bad_image().await;
    let before = scenario.statefulset().status.expect("status");
    scenario.set_image("quiver:1");
    // The template is back to the current revision: the StatefulSet names it as before.
    eventually(Duration::from_secs(60), || {
        let status = scenario.statefulset().status.expect("status");
        status.update_revision == before.current_revision
    })
    .await;
    recovers_to(&scenario, "quiver:1").await;
    scenario.stop().await;
}
