//! A rollout to an image that never becomes Ready: after spec.progressDeadlineSeconds the Broker
//! is Degraded (ProgressDeadlineExceeded, with a Warning event); fixing the image in the spec is
//! enough to recover, because the operator deletes the pod stuck at the bad revision that the
//! StatefulSet controller would otherwise wait for forever (kubernetes/kubernetes#67250).

use super::{
    condition, set_pod, set_revisions, settle_statefulset, stored_broker, LAG_INTERVAL, NOW_MS,
};
use crate::controller::broker::reconcile;
use crate::controller::Context;
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

static CLOCK_MS: AtomicI64 = AtomicI64::new(NOW_MS);

fn scenario_clock() -> i64 {
    CLOCK_MS.load(Ordering::SeqCst)
}

fn edit_image(api: &FakeApiServer, image: &str) {
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["image"] = image.into();
        let generation = broker["metadata"]["generation"].as_i64().unwrap_or(1);
        broker["metadata"]["generation"] = (generation + 1).into();
    });
}

fn partition(api: &FakeApiServer) -> i32 {
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    crate::controller::rollout::current_partition(&sts)
}

#[tokio::test]
async fn a_bad_image_exceeds_the_deadline_and_a_fixed_spec_recovers_without_help() {
    let (client, api) = FakeApiServer::start();
    let ctx = Arc::new(
        Context::new(
            client,
            Arc::new(FakeAdmin::default()),
            Arc::default(),
            LAG_INTERVAL,
        )
        .with_clock(scenario_clock),
    );
    let broker = Broker::test().replicas(3).image("quiver:1");
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 3, 3);
    set_revisions(&api, "rev1", "rev1");
    for ordinal in 0..3 {
        set_pod(&api, ordinal, "rev1", true);
    }
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("settles");

    // A bad image: qb-2 is recreated at rev2 and crash-loops.
    edit_image(&api, "quiver:bad");
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("rolls");
    assert_eq!(partition(&api), 2);
    settle_statefulset(&api, 2, 1);
    set_revisions(&api, "rev1", "rev2");
    set_pod(&api, 2, "rev2", false);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("waits");
    assert!(
        api.get(&paths::pod("qb-2")).is_some(),
        "a pod at the update revision is left alone"
    );
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(condition(&status.conditions, "Degraded").0, "False");

    CLOCK_MS.fetch_add(601_000, Ordering::SeqCst);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("still waits");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Degraded"),
        ("True".into(), "ProgressDeadlineExceeded".into())
    );
    assert_eq!(
        condition(&status.conditions, "Progressing").1,
        "RollingUpdate"
    );
    assert!(api
        .event_reasons()
        .contains(&"ProgressDeadlineExceeded".to_string()));

    // The fix: a new image. The StatefulSet moves its update revision to rev3, but qb-2 is
    // still the crash-looping rev2 pod, which it would wait on forever.
    edit_image(&api, "quiver:good");
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("applies the fix");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Degraded").0,
        "False",
        "a new spec gets a full deadline"
    );
    settle_statefulset(&api, 2, 0);
    set_revisions(&api, "rev1", "rev3");
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("unsticks");
    assert!(
        api.get(&paths::pod("qb-2")).is_none(),
        "the stuck rev2 pod is deleted"
    );
    assert!(api.event_reasons().contains(&"StuckPodDeleted".to_string()));
    assert!(
        api.get(&paths::pod("qb-1")).is_some(),
        "pods below the partition are left alone"
    );

    // The StatefulSet controller recreates qb-2 at rev3 and it becomes Ready: the rollout steps.
    set_pod(&api, 2, "rev3", true);
    settle_statefulset(&api, 3, 1);
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("steps");
    assert_eq!(partition(&api), 1);
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(condition(&status.conditions, "Degraded").0, "False");
}
