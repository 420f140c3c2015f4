//! A `spec.replicas` change starts or stops only the pods it adds or removes: scaling out
//! creates the new pods and restarts none of the others (same uids, same template hash), whose
//! config files list the new brokers as peers (a running broker re-reads them); scaling in
//! deletes only the drained pods, and the files stop listing them.

use super::{addr, eventually, holds_for, Scenario};
use crate::desired::TEMPLATE_HASH_ANNOTATION;
use k8s_openapi::api::core::v1::ConfigMap;
use std::time::Duration;

/// The uid of each of `pods`.
fn uids(scenario: &Scenario, pods: &[&str]) -> Vec<Option<String>> {
    pods.iter().map(|pod| scenario.pod_uid(pod)).collect()
}

/// The template hash of the StatefulSet's pod template.
fn template_hash(scenario: &Scenario) -> String {
    let template = scenario.statefulset().spec.template;
    template
        .metadata
        .unwrap_or_default()
        .annotations
        .unwrap_or_default()[TEMPLATE_HASH_ANNOTATION]
        .clone()
}

/// The `peers` of pod `pod`'s config file in the ConfigMap.
fn peers(scenario: &Scenario, pod: &str) -> Vec<String> {
    let map: ConfigMap = scenario
        .server
        .object("ns", "qb-config")
        .expect("the ConfigMap");
    let file = &map.data.unwrap_or_default()[&format!("{pod}.json")];
    let settings: serde_json::Value = serde_json::from_str(file).expect("JSON");
    serde_json::from_value(settings["peers"].clone()).expect("a list")
}

/// Checks that `kept` pods still run as they did (`before`), none deleted, the hash `hash`.
fn nothing_restarted(scenario: &Scenario, kept: &[&str], before: &[Option<String>], hash: &str) {
    assert_eq!(uids(scenario, kept), before, "{kept:?} restarted");
    for pod in kept {
        assert_eq!(scenario.pod_delete_index(pod), None, "{pod} deleted");
    }
    assert_eq!(template_hash(scenario), hash, "the pod template changed");
}

#[tokio::test(start_paused = true)]
async fn scaling_a_broker_out_and_in_restarts_no_staying_pod() {
    let scenario = Scenario::settled(2).await;
    let kept = ["qb-0", "qb-1"];
    let before = uids(&scenario, &kept);
    assert!(before.iter().all(Option::is_some), "{before:?}");
    let hash = template_hash(&scenario);
    assert_eq!(peers(&scenario, "qb-0"), [addr(1)]);

    scenario.scale_to(3);
    eventually(Duration::from_secs(600), || {
        scenario.pods_ready_on(3, "quiver:1") && scenario.broker_ready()
    })
    .await;
    nothing_restarted(&scenario, &kept, &before, &hash);
    assert_eq!(peers(&scenario, "qb-0"), [addr(1), addr(2)]);
    assert_eq!(peers(&scenario, "qb-1"), [addr(0), addr(2)]);
    assert_eq!(peers(&scenario, "qb-2"), [addr(0), addr(1)]);
    holds_for(
        Duration::from_secs(60),
        "no restart after the scale-out",
        || uids(&scenario, &kept) == before && scenario.broker_ready(),
    )
    .await;

    // Nothing to read on qb-2: its drain ends at once and only its pod goes.
    scenario.scale_to(2);
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 2
            && scenario.pods_ready_on(2, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    assert_eq!(scenario.pod_uid("qb-2"), None, "the drained pod is gone");
    nothing_restarted(&scenario, &kept, &before, &hash);
    assert_eq!(peers(&scenario, "qb-0"), [addr(1)]);
    assert_eq!(peers(&scenario, "qb-1"), [addr(0)]);
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn adding_and_removing_a_broker_group_restarts_no_other_member() {
    let scenario = Scenario::settled_replicated(1, 2, 1).await;
    let kept = ["qb-0", "qb-1"];
    let before = uids(&scenario, &kept);
    assert!(before.iter().all(Option::is_some), "{before:?}");
    let hash = template_hash(&scenario);
    assert!(peers(&scenario, "qb-0").is_empty(), "one group, no peers");

    // The fake brokers of the new group answer as one, replica 0 its master.
    scenario
        .admin
        .set_replication_group("qb-g1", &[addr(2), addr(3)], 1);
    scenario.scale_to(2);
    eventually(Duration::from_secs(600), || {
        scenario.pods_ready_on(4, "quiver:1") && scenario.broker_ready()
    })
    .await;
    nothing_restarted(&scenario, &kept, &before, &hash);
    for pod in kept {
        assert_eq!(peers(&scenario, pod), [addr(2), addr(3)], "{pod}");
    }
    assert_eq!(peers(&scenario, "qb-3"), [addr(0), addr(1)]);

    scenario.scale_to(1);
    eventually(Duration::from_secs(600), || {
        scenario.sts_replicas() == 2
            && scenario.pods_ready_on(2, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    nothing_restarted(&scenario, &kept, &before, &hash);
    for pod in kept {
        assert!(peers(&scenario, pod).is_empty(), "{pod}");
    }
    scenario.stop().await;
}
