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
/// two pods to the drifted template before the operator hears of it (delete, create, Ready
/// for each), as a real one may. Returns the drifted pods' names. The simulator rolls the
/// lowest ordinals first (a real controller the highest): whichever it took, the operator
/// must roll them back from the highest down under its own partition.
async fn drift_behind_the_operator(
    scenario: &Scenario,
    manager: &str,
    patch: Value,
    drifted: &impl Fn(&Pod) -> bool,
) -> Vec<String> {
    scenario.server.hold_watches::<StatefulSet>();
    kubectl_patch(scenario, manager, patch).await;
    let drifted_names = || -> Vec<String> {
        let pods = scenario.server.list::<Pod>("ns");
        pods.iter()
            .filter(|pod| drifted(pod) && is_ready(pod))
            .map(|pod| pod.metadata.name.clone().unwrap_or_default())
            .collect()
    };
    // Passes enough for two pods to stop, come back and be Ready; bounded.
    for _ in 0..40 {
        if drifted_names().len() >= 2 {
            break;
        }
        scenario.server.step();
    }
    let rolled = drifted_names();
    scenario.server.release_watches::<StatefulSet>();
    rolled
}

fn is_ready(pod: &Pod) -> bool {
    let conditions = pod
        .status
        .as_ref()
        .and_then(|status| status.conditions.as_ref());
    conditions
        .into_iter()
        .flatten()
        .any(|condition| condition.type_ == "Ready" && condition.status == "True")
}

/// What a recovery did: the highest partition the operator set, and the drifted pods in the
/// order they were rolled back.
struct Recovery {
    highest_partition: i32,
    rolled_back: Vec<String>,
}

/// Follows the recovery until every pod runs the Broker's template and is Ready, noting the
/// partitions the operator set and the order the drifted pods were replaced in.
async fn recovered(scenario: &Scenario, drifted: impl Fn(&Pod) -> bool) -> Recovery {
    let mut recovery = Recovery {
        highest_partition: 0,
        rolled_back: Vec::new(),
    };
    let mut still_drifted: Vec<String> = Vec::new();
    eventually(Duration::from_secs(600), || {
        let partition = current_partition(&scenario.statefulset());
        recovery.highest_partition = recovery.highest_partition.max(partition);
        let pods = scenario.server.list::<Pod>("ns");
        let now: Vec<String> = pods
            .iter()
            .filter(|pod| drifted(pod))
            .map(|pod| pod.metadata.name.clone().unwrap_or_default())
            .collect();
        let gone = still_drifted.iter().filter(|name| !now.contains(name));
        recovery.rolled_back.extend(gone.cloned());
        still_drifted = now;
        pods.len() == 3
            && still_drifted.is_empty()
            && scenario.pods_ready_on(3, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    recovery
}

/// Checks a recovery rolled `rolled` back one at a time, highest ordinal first, the partition
/// opened at the highest of them: what the simulator, going lowest first, would never do alone.
fn assert_rolled_back_stepwise(recovery: &Recovery, rolled: &[String]) {
    let mut highest_first = rolled.to_vec();
    highest_first.sort_by(|a, b| b.cmp(a));
    assert!(
        rolled.len() >= 2,
        "the controller rolled two pods: {rolled:?}"
    );
    assert_eq!(
        recovery.rolled_back, highest_first,
        "rolled back one at a time, highest first"
    );
    let highest = highest_first[0]
        .rsplit('-')
        .next()
        .and_then(|n| n.parse().ok());
    assert_eq!(
        Some(recovery.highest_partition),
        highest,
        "the operator's partition opened at the highest drifted pod"
    );
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
    let carries_debug = |pod: &Pod| env_names(pod.spec.as_ref()).contains(&"DEBUG".to_string());
    let rolled = drift_behind_the_operator(
        &scenario,
        "kubectl-edit",
        json!({"spec": {"template": {"spec": {"containers": containers}}}}),
        &carries_debug,
    )
    .await;

    let recovery = recovered(&scenario, carries_debug).await;
    assert_rolled_back_stepwise(&recovery, &rolled);
    let sts = scenario.statefulset();
    assert!(
        !env_names(sts.spec.template.spec.as_ref()).contains(&"DEBUG".to_string()),
        "the template is the Broker's again"
    );
    let drift = scenario.event("TemplateDrift", "Warning");
    let note = drift["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(
            "by kubectl-edit: spec.template.spec.containers[name=broker].env[name=DEBUG])"
        ) && rolled.iter().all(|pod| note.contains(pod.as_str())),
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
    let carries_restarted_at = |pod: &Pod| {
        pod.metadata
            .annotations
            .as_ref()
            .is_some_and(|annotations| annotations.contains_key(RESTARTED_AT))
    };
    let rolled =
        drift_behind_the_operator(&scenario, "kubectl-rollout", patch, &carries_restarted_at).await;

    let recovery = recovered(&scenario, carries_restarted_at).await;
    assert_rolled_back_stepwise(&recovery, &rolled);
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
