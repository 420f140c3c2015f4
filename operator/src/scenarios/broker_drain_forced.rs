//! quiver.io/force-scale-down: a drain that would wait forever (nobody reads what the leaving
//! broker holds) is cut short on request, with a Warning event naming what is dropped.

use super::{addr, eventually, holds_for, Scenario};
use crate::crd::FORCE_SCALE_DOWN_ANNOTATION;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_blocked_drain_waits_until_the_annotation_forces_it() {
    let scenario = Scenario::settled(3).await;
    scenario
        .admin
        .set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    scenario
        .admin
        .set_topic_queue(&addr(2), ("audit-log", 0), (0, 20), None);
    scenario.scale_to(2);
    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    holds_for(Duration::from_secs(300), "the blocked drain", || {
        scenario.sts_replicas() == 3 && scenario.status().drain.is_some()
    })
    .await;

    scenario.annotate(FORCE_SCALE_DOWN_ANNOTATION, "true");
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 2
            && scenario.pods_ready_on(2, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    assert_eq!(scenario.status().drain, None);
    let forced = scenario.event("ForcedScaleDown", "Warning");
    let note = forced["note"].as_str().unwrap_or_default();
    for part in [
        "qb-2",
        "60 messages unread by billing",
        "20 messages",
        "audit-log",
    ] {
        assert!(note.contains(part), "{part:?} not in {note}");
    }
    assert!(scenario.events("Drained").is_empty(), "forced, not drained");
    scenario.stop().await;
}
