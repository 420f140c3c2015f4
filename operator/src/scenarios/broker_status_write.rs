//! One status write path: every status write (a pass's, a failure's) is built from a fresh read
//! of the object and applied server-side, so a status write that fails neither reverts a
//! condition another writer set nor loses one the operator wrote that its watch has not shown
//! yet.

use super::{condition, eventually, holds_for, Scenario};
use crate::crd::Broker;
use crate::testapi::PodBehaviour;
use http::Method;
use serde_json::json;
use std::time::Duration;

const STATUS: &str = "/apis/quiver.io/v1alpha1/namespaces/ns/brokers/qb/status";
const STATEFULSET: &str = "/apis/apps/v1/namespaces/ns/statefulsets/qb";
const AUDITED: &str = "example.com/Audited";

fn has_condition(scenario: &Scenario, type_: &str) -> bool {
    let conditions = scenario.status().conditions;
    conditions.iter().any(|condition| condition.type_ == type_)
}

#[tokio::test(start_paused = true)]
async fn a_failed_status_write_does_not_revert_a_condition_another_writer_set() {
    let scenario = Scenario::settled(2).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    // The operator's watch never shows the other writer's condition: only a fresh read does.
    scenario.server.hold_watches::<Broker>();
    scenario.server.edit_status::<Broker>("ns", "qb", |broker| {
        let conditions = broker["status"]["conditions"]
            .as_array_mut()
            .expect("conditions");
        conditions.push(json!({
            "type": AUDITED, "status": "True", "reason": "Audited",
            "message": "checked by another tool", "lastTransitionTime": "2023-11-14T22:13:20Z",
        }));
    });
    scenario.server.fail_next(Method::PATCH, STATUS, 1, 500);
    scenario
        .server
        .set_pod_behaviour("ns", "qb-1", PodBehaviour::CrashLoop);

    // The pass's write fails, the failure is reported, the retry writes Ready=False: the other
    // writer's condition is there all along.
    eventually(Duration::from_secs(120), || {
        condition(&scenario.status().conditions, "Ready").0 == "False"
    })
    .await;
    let failures = scenario.events("ReconcileError");
    let note = failures
        .first()
        .and_then(|event| event["note"].as_str())
        .unwrap_or_default()
        .to_string();
    assert!(note.contains("writing status of Broker qb"), "{note}");
    holds_for(
        Duration::from_secs(60),
        "the other writer's condition",
        || has_condition(&scenario, AUDITED),
    )
    .await;

    scenario.server.clear_pod_behaviour("ns", "qb-1");
    eventually(Duration::from_secs(120), || scenario.broker_ready()).await;
    assert!(has_condition(&scenario, AUDITED), "{:?}", scenario.status());
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_failure_report_keeps_a_condition_the_watch_has_not_shown_yet() {
    let scenario = Scenario::settled(2).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    // The operator's own writes do not come back through its watch from here.
    scenario.server.hold_watches::<Broker>();
    scenario
        .server
        .set_pod_behaviour("ns", "qb-1", PodBehaviour::CrashLoop);
    eventually(Duration::from_secs(120), || {
        condition(&scenario.status().conditions, "Ready").0 == "False"
    })
    .await;
    let ready_went_false = scenario.status().conditions;

    // The next pass fails at its StatefulSet apply: its report must keep Ready=False (stored,
    // not yet in the watch's copy, which still says True).
    scenario
        .server
        .fail_next(Method::PATCH, STATEFULSET, 1, 500);
    eventually(Duration::from_secs(120), || {
        condition(&scenario.status().conditions, "Degraded")
            == ("True".into(), "ReconcileError".into())
    })
    .await;
    holds_for(Duration::from_secs(60), "Ready=False as written", || {
        let conditions = scenario.status().conditions;
        let ready = conditions.iter().find(|c| c.type_ == "Ready");
        let was = ready_went_false.iter().find(|c| c.type_ == "Ready");
        ready.map(|c| (&c.status, &c.last_transition_time))
            == was.map(|c| (&c.status, &c.last_transition_time))
    })
    .await;
    scenario.stop().await;
}
