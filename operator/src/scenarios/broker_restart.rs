//! A restart asked for with the `quiver.io/restart` annotation: stepped like a rollout (one pod
//! at a time under the partition the operator sets, highest ordinal first; a replicated group's
//! replicas first and its master after a switchover), with events and status saying it is in
//! progress and done. A new token asks again; removing the annotation restarts nothing.

use super::{eventually, holds_for, Scenario};
use crate::controller::rollout::current_partition;
use crate::crd::{RestartState, RESTART_ANNOTATION};
use std::collections::BTreeMap;
use std::time::Duration;

/// Each pod's uid, by name (a restarted pod has a new one).
fn uids(scenario: &Scenario) -> BTreeMap<String, String> {
    scenario
        .pods()
        .into_iter()
        .filter_map(|(name, ..)| Some((name.clone(), scenario.pod_uid(&name)?)))
        .collect()
}

/// The pods whose uid is not the one in `before`.
fn restarted(scenario: &Scenario, before: &BTreeMap<String, String>) -> Vec<String> {
    let now = uids(scenario);
    before
        .iter()
        .filter(|(name, uid)| now.get(*name).is_some_and(|now| now != *uid))
        .map(|(name, _)| name.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_restart_annotation_restarts_each_pod_once_highest_first_under_the_partition() {
    let scenario = Scenario::settled(3).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let before = uids(&scenario);
    scenario.annotate(RESTART_ANNOTATION, "2026-12-06T18:00:00Z");

    let mut partitions: Vec<i32> = Vec::new();
    let mut order: Vec<String> = Vec::new();
    let mut saw_restarting = false;
    eventually(Duration::from_secs(900), || {
        let partition = current_partition(&scenario.statefulset());
        if partitions.last() != Some(&partition) {
            partitions.push(partition);
        }
        for name in restarted(&scenario, &before) {
            if !order.contains(&name) {
                order.push(name);
            }
        }
        saw_restarting |=
            scenario.condition("Progressing") == Some(("True".into(), "Restarting".into()));
        let done = scenario
            .status()
            .restart
            .is_some_and(|restart| restart.state == RestartState::Completed);
        done && scenario.broker_ready() && order.len() == 3
    })
    .await;
    assert_eq!(order, ["qb-2", "qb-1", "qb-0"], "highest ordinal first");
    assert_eq!(
        partitions,
        [0, 2, 1, 0],
        "the operator's partition stepped each pod"
    );
    assert!(saw_restarting, "Progressing said Restarting meanwhile");
    let restart = scenario.status().restart.expect("recorded");
    assert_eq!(restart.token, "2026-12-06T18:00:00Z");
    let started = scenario.event("RestartStarted", "Normal");
    assert!(
        started["note"]
            .as_str()
            .is_some_and(|note| note.contains("2026-12-06T18:00:00Z")),
        "{started}"
    );
    scenario.event("RestartCompleted", "Normal");

    // Removing the annotation asks for nothing; a new token asks again.
    let settled = uids(&scenario);
    scenario.edit_broker(|broker| {
        broker["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(RESTART_ANNOTATION);
    });
    holds_for(Duration::from_secs(120), "no pod restarted", || {
        uids(&scenario) == settled
    })
    .await;
    scenario.annotate(RESTART_ANNOTATION, "second");
    eventually(Duration::from_secs(900), || {
        restarted(&scenario, &settled).len() == 3 && scenario.broker_ready()
    })
    .await;
    // The event recorder counts a repeated reason as a series of the first event.
    let started = scenario.events("RestartStarted");
    assert_eq!(started.len(), 1, "{started:?}");
    assert_eq!(started[0]["series"]["count"], 2, "{started:?}");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_replicated_group_restarts_its_replicas_then_switches_over_then_the_old_master() {
    let scenario = Scenario::settled_replicated(1, 3, 2).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let before = uids(&scenario);
    scenario.annotate(RESTART_ANNOTATION, "now");

    let mut steps: Vec<String> = Vec::new();
    let mut switchovers_seen = 0;
    eventually(Duration::from_secs(1200), || {
        let switchovers = scenario.admin.switchovers();
        for (_, target) in &switchovers[switchovers_seen..] {
            steps.push(format!("switchover to {target}"));
        }
        switchovers_seen = switchovers.len();
        for name in restarted(&scenario, &before) {
            let step = format!("restart {name}");
            if !steps.contains(&step) {
                steps.push(step);
            }
        }
        let done = scenario
            .status()
            .restart
            .is_some_and(|restart| restart.state == RestartState::Completed);
        done && scenario.broker_ready() && restarted(&scenario, &before).len() == 3
    })
    .await;
    assert_eq!(
        steps,
        [
            "restart qb-2",
            "restart qb-1",
            "switchover to 1",
            "restart qb-0"
        ],
        "replicas first, then the switchover, then the old master"
    );
    scenario.event("RestartCompleted", "Normal");
    scenario.stop().await;
}
