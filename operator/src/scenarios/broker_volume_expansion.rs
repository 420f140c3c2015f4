//! A larger storage size patches the existing claims and reports resize progress, once the
//! default StorageClass is seen to allow volume expansion.

use super::{condition, context, set_storage_class, settle_statefulset, stored_broker};
use crate::controller::broker::reconcile;
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::json;
use std::sync::Arc;

#[tokio::test]
async fn claims_grow_and_progress_is_reported() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(1);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 1, 1);
    let claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data-qb-0", "namespace": "ns"},
        "spec": {"resources": {"requests": {"storage": "10Gi"}}},
        "status": {"capacity": {"storage": "10Gi"}},
    });
    api.insert(&paths::pvc("data-qb-0"), &claim);
    set_storage_class(&api, "standard", true, true);

    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["storage"]["size"] = "20Gi".into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("expands");
    let stored_claim = api.get(&paths::pvc("data-qb-0")).unwrap();
    assert_eq!(
        stored_claim["spec"]["resources"]["requests"]["storage"],
        "20Gi"
    );
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    let template_size = &sts.spec.volume_claim_templates.unwrap()[0]
        .spec
        .clone()
        .unwrap()
        .resources
        .unwrap()
        .requests
        .unwrap()["storage"];
    assert_eq!(
        template_size.0, "10Gi",
        "volumeClaimTemplates are immutable and left as created"
    );
    let status = stored_broker(&api).status.unwrap();
    let storage = status.storage.clone().expect("storage progress");
    assert_eq!(
        (
            storage.requested.as_str(),
            storage.resized_claims,
            storage.total_claims
        ),
        ("20Gi", 0, 1)
    );
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "ExpandingVolumes".into())
    );
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("True".into(), "Expanding".into())
    );

    api.set_status(
        &paths::pvc("data-qb-0"),
        json!({"capacity": {"storage": "20Gi"}}),
    );
    api.clear_requests();
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("observes the resize");
    assert!(
        !api.requests()
            .contains(&format!("PATCH {}", paths::pvc("data-qb-0"))),
        "no patch once requested"
    );
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(status.storage.unwrap().resized_claims, 1);
    assert_eq!(condition(&status.conditions, "Progressing").0, "False");
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("True".into(), "VolumesExpanded".into())
    );
}
