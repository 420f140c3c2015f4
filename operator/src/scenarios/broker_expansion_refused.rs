//! A resize the StorageClass does not allow is refused up front with a condition and a Warning
//! event; a claim patch the API server rejects is reported the same way. Neither fails the
//! reconcile, so every other change still applies.

use super::{
    condition, condition_message, context, set_storage_class, settle_statefulset, stored_broker,
};
use crate::controller::broker::reconcile;
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::json;
use std::sync::Arc;

async fn one_broker_with_a_claim() -> (FakeApiServer, Arc<crate::Context>) {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(1);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 1, 1);
    api.insert(
        &paths::pvc("data-qb-0"),
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data-qb-0", "namespace": "ns"},
            "spec": {"storageClassName": "standard", "resources": {"requests": {"storage": "10Gi"}}},
            "status": {"capacity": {"storage": "10Gi"}},
        }),
    );
    (api, ctx)
}

fn grow_and_change_image(api: &FakeApiServer) {
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["storage"]["size"] = "20Gi".into();
        broker["spec"]["image"] = "quiver:2".into();
        broker["metadata"]["generation"] = 2.into();
    });
}

fn template_image(api: &FakeApiServer) -> String {
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    sts.spec.template.spec.unwrap().containers[0]
        .image
        .clone()
        .unwrap()
}

#[tokio::test]
async fn a_class_without_allow_volume_expansion_refuses_before_any_patch() {
    let (api, ctx) = one_broker_with_a_claim().await;
    set_storage_class(&api, "standard", true, false);
    grow_and_change_image(&api);
    api.clear_requests();
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("a refused expansion does not fail the reconcile");
    assert!(
        !api.requests()
            .contains(&format!("PATCH {}", paths::pvc("data-qb-0"))),
        "no claim patch the API server would reject"
    );
    assert_eq!(
        template_image(&api),
        "quiver:2",
        "the rest of the spec applies"
    );
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("False".into(), "StorageClassForbidsExpansion".into())
    );
    let message = condition_message(&status.conditions, "VolumeExpansion");
    assert!(message.contains("StorageClass standard"), "{message}");
    assert_eq!(
        condition(&status.conditions, "Progressing").1,
        "Stable",
        "a refused expansion is not progress"
    );
    assert!(api
        .event_reasons()
        .contains(&"StorageClassForbidsExpansion".to_string()));

    let events = api.event_reasons().len();
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("still refused");
    assert_eq!(api.event_reasons().len(), events, "no repeated warning");
}

#[tokio::test]
async fn a_rejected_claim_patch_is_a_condition_not_a_failed_reconcile() {
    let (api, ctx) = one_broker_with_a_claim().await;
    set_storage_class(&api, "standard", true, true);
    grow_and_change_image(&api);
    api.fail_next("PATCH", &paths::pvc("data-qb-0"), 422);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("a rejected patch does not fail the reconcile");
    assert_eq!(template_image(&api), "quiver:2");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("False".into(), "ExpansionRejected".into())
    );
    assert!(condition_message(&status.conditions, "VolumeExpansion").contains("data-qb-0"));
    assert!(api
        .event_reasons()
        .contains(&"ExpansionRejected".to_string()));

    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("retried");
    let claim = api.get(&paths::pvc("data-qb-0")).unwrap();
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "20Gi");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("True".into(), "Expanding".into())
    );
}
