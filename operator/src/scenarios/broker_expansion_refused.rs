//! A resize the StorageClass does not allow (allowVolumeExpansion false) is refused up front:
//! VolumeExpansion False StorageClassForbidsExpansion with one Warning event, the claims
//! unchanged, and the rest of the same spec change (a new image) still applied.

use super::{condition, condition_message, eventually, Scenario};
use crate::crd::Broker;
use crate::fixtures::BrokerFixture;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn the_claims_stay_and_the_image_still_rolls() {
    let scenario = Scenario::start(false).await;
    scenario.create_broker(Broker::test().replicas(2).image("quiver:1"));
    eventually(Duration::from_secs(300), || scenario.broker_ready()).await;

    scenario.edit_broker(|broker| {
        broker["spec"]["storage"]["size"] = "20Gi".into();
        broker["spec"]["image"] = "quiver:2".into();
    });
    eventually(Duration::from_secs(900), || {
        scenario.pods_ready_on(2, "quiver:2") && scenario.broker_ready()
    })
    .await;
    let status = scenario.status();
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("False".into(), "StorageClassForbidsExpansion".into())
    );
    let message = condition_message(&status.conditions, "VolumeExpansion");
    assert!(message.contains("StorageClass standard"), "{message}");
    assert_eq!(scenario.events("StorageClassForbidsExpansion").len(), 1);
    scenario.event("StorageClassForbidsExpansion", "Warning");
    for claim in scenario.server.list::<PersistentVolumeClaim>("ns") {
        let requests = claim
            .spec
            .and_then(|s| s.resources)
            .and_then(|r| r.requests);
        assert_eq!(
            requests.expect("requests")["storage"].0,
            "10Gi",
            "claim unchanged"
        );
    }
    assert_eq!(
        scenario
            .server
            .request_count("patch", "persistentvolumeclaims", "data-qb-0", ""),
        0,
        "no claim patch the API server would refuse"
    );
    scenario.stop().await;
}
