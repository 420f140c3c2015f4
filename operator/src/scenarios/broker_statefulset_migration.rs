//! An older operator's StatefulSet (OrderedReady pod management, which a StatefulSet cannot
//! change) is migrated to Parallel without a restart: deleted with its pods and claims
//! orphaned, created again, the pods adopted at the same revision.

use super::{eventually, Scenario};
use crate::crd::{Broker, PAUSE_ANNOTATION};
use crate::desired::{self, RolloutPlan};
use crate::fixtures::BrokerFixture;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use std::time::Duration;

/// A Broker `name` of three brokers whose StatefulSet an older operator made (OrderedReady),
/// its pods Ready, and the Broker paused so far: un-pausing it hands it to this operator.
pub async fn broker_of_an_older_operator(scenario: &Scenario, name: &str) {
    let mut broker = Broker::test().replicas(3).image("quiver:1");
    broker.metadata.name = Some(name.to_string());
    broker.metadata.annotations = Some([(PAUSE_ANNOTATION.to_string(), "true".to_string())].into());
    scenario.create_broker(broker);
    let stored: Broker = scenario.server.object("ns", name).expect("Broker stored");
    let mut legacy = desired::stateful_set(&stored, &RolloutPlan::initial(&stored));
    legacy.spec.pod_management_policy = Some("OrderedReady".to_string());
    scenario.server.insert(&legacy);
    eventually(Duration::from_secs(300), || {
        let pods = scenario.pods();
        (0..3).all(|ordinal| {
            let pod = format!("{name}-{ordinal}");
            pods.iter().any(|(each, _, ready)| *each == pod && *ready)
        })
    })
    .await;
    scenario.server.edit::<Broker>("ns", name, |broker| {
        broker["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(PAUSE_ANNOTATION);
    });
}

/// Whether the StatefulSet `name` exists with Parallel pod management.
pub fn parallel(scenario: &Scenario, name: &str) -> bool {
    scenario
        .server
        .object::<StatefulSet>("ns", name)
        .is_some_and(|sts| sts.spec.pod_management_policy.as_deref() == Some("Parallel"))
}

#[tokio::test(start_paused = true)]
async fn an_ordered_ready_statefulset_is_recreated_parallel_keeping_its_pods() {
    let scenario = Scenario::start(true).await;
    broker_of_an_older_operator(&scenario, "qb").await;
    let uids = |scenario: &Scenario| {
        (0..3)
            .map(|o| scenario.pod_uid(&format!("qb-{o}")))
            .collect::<Vec<_>>()
    };
    let before = uids(&scenario);
    let old_sts = scenario.statefulset().metadata.uid;

    eventually(Duration::from_secs(300), || {
        parallel(&scenario, "qb")
            && scenario.broker_ready()
            && scenario.pods_ready_on(3, "quiver:1")
    })
    .await;
    assert_ne!(
        scenario.statefulset().metadata.uid,
        old_sts,
        "created again"
    );
    assert_eq!(uids(&scenario), before, "no pod restarted");
    for ordinal in 0..3 {
        let pod = format!("qb-{ordinal}");
        assert_eq!(scenario.pod_delete_index(&pod), None, "{pod} deleted");
        let owner = scenario
            .server
            .object::<Pod>("ns", &pod)
            .and_then(|pod| pod.metadata.owner_references)
            .and_then(|owners| {
                owners
                    .into_iter()
                    .find(|owner| owner.controller == Some(true))
            });
        assert_eq!(
            owner.map(|owner| owner.uid),
            scenario.statefulset().metadata.uid
        );
    }
    assert_eq!(
        scenario.server.list::<PersistentVolumeClaim>("ns").len(),
        3,
        "claims kept"
    );
    let replaced = scenario.event("StatefulSetReplaced", "Normal");
    let note = replaced["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("podManagementPolicy OrderedReady becomes Parallel"),
        "{note}"
    );
    scenario.stop().await;
}
