//! A larger storage size, the StorageClass allowing expansion: every claim is patched, the
//! resize is followed in status, and the StatefulSet's claim templates stay as created.

use super::{condition, eventually, Scenario};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use std::time::Duration;

fn claim_sizes(scenario: &Scenario) -> Vec<(String, String)> {
    scenario
        .server
        .list::<PersistentVolumeClaim>("ns")
        .into_iter()
        .map(|claim| {
            let request = claim
                .spec
                .and_then(|spec| spec.resources)
                .and_then(|r| r.requests);
            let capacity = claim.status.and_then(|status| status.capacity);
            let size = |sizes: Option<std::collections::BTreeMap<_, _>>| {
                sizes
                    .and_then(|mut sizes| sizes.remove("storage"))
                    .map(|q: k8s_openapi::apimachinery::pkg::api::resource::Quantity| q.0)
                    .unwrap_or_default()
            };
            (size(request), size(capacity))
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn claims_grow_and_the_status_follows_the_resize() {
    let scenario = Scenario::settled(2).await;
    scenario.edit_broker(|broker| broker["spec"]["storage"]["size"] = "20Gi".into());
    eventually(Duration::from_secs(120), || {
        scenario
            .condition("VolumeExpansion")
            .is_some_and(|(status, _)| status == "True")
    })
    .await;
    eventually(Duration::from_secs(300), || {
        let storage = scenario.status().storage;
        storage.is_some_and(|storage| storage.resized_claims == 2) && scenario.broker_ready()
    })
    .await;
    let grown = ("20Gi".to_string(), "20Gi".to_string());
    assert_eq!(claim_sizes(&scenario), [grown.clone(), grown]);
    let status = scenario.status();
    assert_eq!(
        condition(&status.conditions, "VolumeExpansion"),
        ("True".into(), "VolumesExpanded".into())
    );
    let storage = status.storage.expect("storage");
    assert_eq!(
        (storage.requested.as_str(), storage.total_claims),
        ("20Gi", 2)
    );
    let template = scenario
        .statefulset()
        .spec
        .volume_claim_templates
        .expect("claims");
    let requests = template[0]
        .spec
        .clone()
        .and_then(|s| s.resources)
        .and_then(|r| r.requests);
    assert_eq!(
        requests.expect("requests")["storage"].0,
        "10Gi",
        "volumeClaimTemplates are immutable and left as created"
    );
    scenario.stop().await;
}
