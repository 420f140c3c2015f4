//! Changes made to the StatefulSet's pod template behind the operator (`kubectl edit sts`
//! adding an env var, `kubectl rollout restart sts`) are noticed from the StatefulSet's
//! managedFields, named in a `TemplateDrift` Warning event, and undone: the template is the
//! Broker's again, and a pod the StatefulSet controller already rolled to the drifted template
//! is rolled back under the operator's own partition, not left as it is.

use super::{eventually, Scenario};
use crate::controller::rollout::current_partition;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use std::time::Duration;

const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// Patches the StatefulSet as kubectl would, under its field manager.
async fn kubectl_patch(scenario: &Scenario, manager: &str, patch: Value) {
    let api: Api<StatefulSet> = Api::namespaced(scenario.ctx.client.clone(), "ns");
    let params = PatchParams {
        field_manager: Some(manager.to_string()),
        ..PatchParams::default()
    };
    api.patch("qb", &params, &Patch::Strategic(patch))
        .await
        .expect("kubectl's patch");
}

/// The broker container's env var names in `template` (a pod's spec or the template's).
fn env_names(spec: Option<&k8s_openapi::api::core::v1::PodSpec>) -> Vec<String> {
    spec.and_then(|spec| spec.containers.first())
        .and_then(|container| container.env.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|var| var.name)
        .collect()
}

/// Patches the StatefulSet as kubectl would, then lets the simulated StatefulSet controller roll
/// the highest pod to the drifted template before the operator hears of it (three passes:
/// delete, create, Ready), as a real one may.
async fn drift_behind_the_operator(scenario: &Scenario, manager: &str, patch: Value) {
    scenario.server.hold_watches::<StatefulSet>();
    kubectl_patch(scenario, manager, patch).await;
    for _ in 0..3 {
        scenario.server.step();
    }
    scenario.server.release_watches::<StatefulSet>();
}

/// Follows the recovery until every pod runs the Broker's template and is Ready: the highest
/// partition the operator set meanwhile.
async fn recovered(scenario: &Scenario, drifted: impl Fn(&Pod) -> bool) -> i32 {
    let mut highest_partition = 0;
    eventually(Duration::from_secs(600), || {
        highest_partition = highest_partition.max(current_partition(&scenario.statefulset()));
        let pods = scenario.server.list::<Pod>("ns");
        pods.len() == 3
            && !pods.iter().any(&drifted)
            && scenario.pods_ready_on(3, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    highest_partition
}

#[tokio::test(start_paused = true)]
async fn an_env_var_added_behind_the_operator_is_named_removed_and_rolled_back_stepwise() {
    let scenario = Scenario::settled(3).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let template = scenario.statefulset().spec.template;
    let mut containers =
        serde_json::to_value(&template.spec.expect("pod spec").containers).expect("containers");
    let env = containers[0]["env"].as_array_mut().expect("env");
    env.push(json!({"name": "DEBUG", "value": "1"}));
    let rolled = scenario.server.object::<Pod>("ns", "qb-2");
    drift_behind_the_operator(
        &scenario,
        "kubectl-edit",
        json!({"spec": {"template": {"spec": {"containers": containers}}}}),
    )
    .await;
    assert_ne!(
        scenario
            .server
            .object::<Pod>("ns", "qb-2")
            .and_then(|pod| pod.metadata.uid),
        rolled.and_then(|pod| pod.metadata.uid),
        "the StatefulSet controller rolled qb-2 to the drifted template"
    );

    let highest_partition = recovered(&scenario, |pod| {
        env_names(pod.spec.as_ref()).contains(&"DEBUG".to_string())
    })
    .await;
    assert_eq!(
        highest_partition, 2,
        "qb-2 rolled back under the operator's partition"
    );
    let sts = scenario.statefulset();
    assert!(
        !env_names(sts.spec.template.spec.as_ref()).contains(&"DEBUG".to_string()),
        "the template is the Broker's again"
    );
    let drift = scenario.event("TemplateDrift", "Warning");
    let note = drift["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("by kubectl-edit: spec.template.spec.containers") && note.contains("qb-2"),
        "{note}"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_rollout_restart_behind_the_operator_is_named_and_undone_stepwise() {
    let scenario = Scenario::settled(3).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let patch = json!({"spec": {"template": {"metadata": {"annotations": {
        RESTARTED_AT: "2026-12-06T18:00:00Z"}}}}});
    drift_behind_the_operator(&scenario, "kubectl-rollout", patch).await;

    let carries_restarted_at = |pod: &Pod| {
        pod.metadata
            .annotations
            .as_ref()
            .is_some_and(|annotations| annotations.contains_key(RESTARTED_AT))
    };
    let highest_partition = recovered(&scenario, carries_restarted_at).await;
    assert_eq!(
        highest_partition, 2,
        "qb-2 rolled back under the operator's partition"
    );
    let annotations = scenario
        .statefulset()
        .spec
        .template
        .metadata
        .and_then(|metadata| metadata.annotations)
        .unwrap_or_default();
    assert!(!annotations.contains_key(RESTARTED_AT), "{annotations:?}");
    let drift = scenario.event("TemplateDrift", "Warning");
    let note = drift["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&format!(
            "by kubectl-rollout: spec.template.metadata.annotations.{RESTARTED_AT}"
        )) && note.contains("quiver.io/restart"),
        "{note}"
    );
    scenario.stop().await;
}
