//! A spec change rolls the pods one at a time, highest ordinal first, each waiting for Ready.

use super::{condition, context, settle_statefulset, stored_broker};
use crate::controller::broker::reconcile;
use crate::crd::Broker;
use crate::desired::TEMPLATE_HASH_ANNOTATION;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use std::sync::Arc;

fn partition(api: &FakeApiServer) -> i32 {
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    sts.spec
        .update_strategy
        .unwrap()
        .rolling_update
        .unwrap()
        .partition
        .unwrap()
}

fn template_image(api: &FakeApiServer) -> String {
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    sts.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

#[tokio::test]
async fn image_change_rolls_pods_in_order() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(3).image("quiver:1");
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 3, 3);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("settles");
    assert_eq!(partition(&api), 0);
    let old_hash = api.get(&paths::statefulset("qb")).unwrap()["spec"]["template"]["metadata"]
        ["annotations"][TEMPLATE_HASH_ANNOTATION]
        .clone();

    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["image"] = "quiver:2".into();
        broker["metadata"]["generation"] = 2.into();
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("starts rollout");
    assert_eq!(template_image(&api), "quiver:2");
    assert_ne!(
        api.get(&paths::statefulset("qb")).unwrap()["spec"]["template"]["metadata"]["annotations"]
            [TEMPLATE_HASH_ANNOTATION],
        old_hash
    );
    let mut partitions = vec![partition(&api)];
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "RollingUpdate".into())
    );
    assert_eq!(status.rollout.as_ref().map(|r| r.partition), Some(2));

    // The StatefulSet controller updated none yet: the partition holds.
    settle_statefulset(&api, 3, 0);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("waits");
    assert_eq!(partition(&api), 2);

    while partition(&api) > 0 {
        let current = partition(&api);
        // The pod at the partition restarted on the new template but is not Ready yet.
        settle_statefulset(&api, 2, 3 - current);
        reconcile(Arc::new(stored_broker(&api)), ctx.clone())
            .await
            .expect("waits for ready");
        assert_eq!(partition(&api), current, "no step while a pod is not Ready");
        settle_statefulset(&api, 3, 3 - current);
        reconcile(Arc::new(stored_broker(&api)), ctx.clone())
            .await
            .expect("steps");
        partitions.push(partition(&api));
    }
    assert_eq!(partitions, vec![2, 1, 0]);
    // The recorder folds the second RolloutStep into the first one's event series.
    assert_eq!(api.event_reasons(), vec!["RolloutStarted", "RolloutStep"]);

    settle_statefulset(&api, 3, 3);
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("settles");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(status.rollout, None);
    assert_eq!(condition(&status.conditions, "Progressing").0, "False");
    assert_eq!(status.observed_generation, Some(2));
}
