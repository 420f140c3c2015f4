//! quiver.io/force-scale-down: a drain that would wait forever (nobody reads a topic, a leaving
//! broker is gone) is cut short on request, with a Warning event naming what is dropped.

use super::broker_scale_down::{settled_brokers, sts_replicas};
use super::{addr, stored_broker};
use crate::controller::broker::reconcile;
use crate::crd::FORCE_SCALE_DOWN_ANNOTATION;
use crate::fixtures::paths;
use std::sync::Arc;

fn force(api: &crate::fixtures::FakeApiServer) {
    api.edit(&paths::broker("qb"), |broker| {
        broker["metadata"]["annotations"] =
            serde_json::json!({ FORCE_SCALE_DOWN_ANNOTATION: "true" });
    });
}

#[tokio::test]
async fn the_annotation_stops_the_wait_and_names_what_is_dropped() {
    let (api, admin, ctx) = settled_brokers(3).await;
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    admin.set_topic_queue(&addr(2), ("audit-log", 0), (0, 20), None);
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("waits");
    assert_eq!(sts_replicas(&api), 3);

    force(&api);
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("forced");
    assert_eq!(sts_replicas(&api), 2);
    assert_eq!(stored_broker(&api).status.unwrap().drain, None);
    let events = api.events();
    let forced = events
        .iter()
        .find(|event| event["reason"] == "ForcedScaleDown")
        .expect("a ForcedScaleDown event");
    assert_eq!(forced["type"], "Warning");
    let note = forced["note"].as_str().unwrap();
    for part in [
        "qb-2",
        "60 messages unread by billing",
        "20 messages",
        "audit-log",
    ] {
        assert!(note.contains(part), "{part:?} not in {note}");
    }
}

#[tokio::test]
async fn a_leaving_broker_that_is_gone_can_be_forced_away() {
    let (api, admin, ctx) = settled_brokers(3).await;
    admin.make_unreachable(&addr(2));
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    force(&api);
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("forced");
    assert_eq!(sts_replicas(&api), 2);
    let events = api.events();
    let forced = events
        .iter()
        .find(|event| event["reason"] == "ForcedScaleDown")
        .expect("a ForcedScaleDown event");
    assert!(forced["note"]
        .as_str()
        .unwrap()
        .contains("qb-2 did not answer"));
}
