//! Restarts and template drift pass by pass: the `quiver.io/restart` token rolls the pods like
//! any template change, and a template field another manager wrote is named, restored and the
//! pods it rolled are rolled back under the partition.

use super::*;
use crate::controller::rollout;
use crate::crd::{RestartState, RESTART_ANNOTATION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use serde_json::json;

fn with_token(broker: &Broker, token: &str) -> Broker {
    let mut annotated = broker.clone();
    annotated
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(RESTART_ANNOTATION.to_string(), token.to_string());
    annotated
}

#[test]
fn a_restart_token_rolls_the_pods_then_completes() {
    let plain = Broker::test().replicas(3).image("quiver:1");
    let asked = with_token(&plain, "t1");
    let mut world = world(asked.clone(), running(&plain, 3, 3));
    let started = pass(&world);
    assert_eq!(
        started.events,
        ["Normal RestartStarted", "Normal RolloutStarted"]
    );
    assert_eq!(rollout::current_partition(sts_of(&started.plan)), 2);
    let restart = started.status.restart.clone().expect("recorded");
    assert_eq!(
        (restart.token.as_str(), restart.state),
        ("t1", RestartState::InProgress)
    );
    assert_eq!(
        condition(&started.status, "Progressing"),
        ("True".into(), "Restarting".into())
    );
    next(&mut world, &started);

    // Midway: qb-1 restarting under partition 1.
    cluster_mut(&mut world).statefulset = Some(rolling(&asked, 3, 1, 2, 2));
    let midway = pass(&world);
    assert!(midway.events.is_empty(), "{:?}", midway.events);
    assert_eq!(
        midway.status.restart.as_ref().map(|r| r.state),
        Some(RestartState::InProgress)
    );
    next(&mut world, &midway);

    // Every pod restarted and Ready: completed, once.
    let done_sts = revisions(rolling(&asked, 3, 0, 3, 3), "rev-2", "rev-2");
    cluster_mut(&mut world).statefulset = Some(done_sts);
    let done = pass(&world);
    assert_eq!(done.events, ["Normal RestartCompleted"]);
    assert_eq!(
        done.status.restart.as_ref().map(|r| r.state),
        Some(RestartState::Completed)
    );
    assert_eq!(
        condition(&done.status, "Progressing"),
        ("False".into(), "Stable".into())
    );
    next(&mut world, &done);
    assert!(pass(&world).events.is_empty(), "no second RestartCompleted");

    // The annotation removed: the template keeps the token, nothing rolls.
    world.broker = Broker {
        status: world.broker.status.clone(),
        ..plain
    };
    let removed = pass(&world);
    assert!(removed.events.is_empty(), "{:?}", removed.events);
    assert_eq!(rollout::current_partition(sts_of(&removed.plan)), 0);
}

/// The operator's StatefulSet for `broker`, edited behind it by kubectl-edit (an env var) and
/// already rolled by the StatefulSet controller on qb-2.
fn drifted(broker: &Broker) -> Cluster {
    let mut sts = revisions(statefulset(broker, 3, 3), "rev-drift", "rev-2");
    let entry = |manager: &str, fields: serde_json::Value| ManagedFieldsEntry {
        manager: Some(manager.to_string()),
        operation: Some("Update".to_string()),
        fields_type: Some("FieldsV1".to_string()),
        fields_v1: Some(FieldsV1(fields)),
        ..ManagedFieldsEntry::default()
    };
    sts.metadata.managed_fields = Some(vec![
        entry(
            desired::FIELD_MANAGER,
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"broker\"}": {".": {}, "f:image": {}}}}}}}),
        ),
        entry(
            "kubectl-edit",
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"broker\"}": {"f:env": {"k:{\"name\":\"DEBUG\"}": {".": {}}}}}}}}}),
        ),
    ]);
    Cluster {
        statefulset: Some(sts),
        pods: Some(Ok(pods(&[
            ("rev-2", true),
            ("rev-2", true),
            ("rev-drift", true),
        ]))),
        ..Cluster::default()
    }
}

#[test]
fn a_template_changed_behind_the_operator_is_named_restored_and_rolled_back() {
    let broker = Broker::test().replicas(3).image("quiver:1");
    let world = world(broker.clone(), drifted(&broker));
    let plan = decide(&world);
    assert_eq!(
        actions(&plan),
        ["event TemplateDrift", "restore template qb"],
        "named, then restored before the apply"
    );
    let note = note_of(&plan, "TemplateDrift");
    assert!(
        note.contains(
            "by kubectl-edit: spec.template.spec.containers[name=broker].env[name=DEBUG]"
        ) && note.contains("qb-2 rolled outside the operator"),
        "{note}"
    );
    let patch = plan
        .steps
        .iter()
        .find_map(|step| match step {
            Step::RestoreTemplate { patch, .. } => Some(patch.clone()),
            _ => None,
        })
        .expect("a restore");
    assert_eq!(
        patch["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        2
    );
    assert_eq!(
        rollout::current_partition(sts_of(&plan)),
        2,
        "qb-2 rolled back under the operator's partition"
    );

    let mut quiet = world.clone();
    let sts = cluster_mut(&mut quiet).statefulset.as_mut().expect("sts");
    sts.metadata.managed_fields = None;
    let plan = decide(&quiet);
    assert!(actions(&plan).is_empty(), "{:?}", actions(&plan));
}

/// A replicated Broker's OnDelete StatefulSet rolls nothing by itself: the drifted template is
/// restored, and the group's rollout does not step against the drifted update revision (it
/// would restart every member onto the drift, or back).
#[test]
fn a_replicated_broker_takes_no_rollout_step_while_its_template_drifted() {
    let broker = Broker::test()
        .replicas(1)
        .replicated(3, 2)
        .image("quiver:1");
    let mut cluster = drifted(&broker);
    cluster.pods = Some(Ok(pods(&[
        ("rev-2", true),
        ("rev-2", true),
        ("rev-2", true),
    ])));
    cluster.groups = Some(vec![members(0, 1, Some(0), &[0, 1, 2])]);
    let plan = decide(&world(broker.clone(), cluster.clone()));
    assert_eq!(
        actions(&plan),
        ["event TemplateDrift", "restore template qb"]
    );
    let note = note_of(&plan, "TemplateDrift");
    assert!(!note.contains("rolled outside"), "{note}");

    // Without the drift the same world steps the rollout (every pod outdated).
    let sts = cluster.statefulset.as_mut().expect("sts");
    sts.metadata.managed_fields = None;
    let plan = decide(&world(broker, cluster));
    assert_eq!(actions(&plan), ["delete pod qb-2"]);
}
