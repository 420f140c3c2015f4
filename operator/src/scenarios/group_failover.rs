//! A new operator continues the judgement from status: the window's runs are persisted in
//! status.lagWindow, so a fresh operator (nothing in memory) declares Stalled when the old one
//! would have; without the persisted window it would start over.

use super::group_support::{GroupScenario, FIRST_POLL};
use super::{eventually, holds_for, LAG_INTERVAL};
use crate::controller::group::DEFAULT_WINDOW;
use crate::crd::ConsumerGroup;
use k8s_openapi::jiff::Timestamp;

/// Group billing with lag that never moves and a member connected, judged by a first operator
/// for half the default window; the stall's start as status says it.
async fn half_a_window_stuck() -> (GroupScenario, String) {
    let mut scenario = GroupScenario::with_one_queue(100, Some(40), None).await;
    scenario.create_group(|_| {});
    eventually(FIRST_POLL, || scenario.polled()).await;
    holds_for(DEFAULT_WINDOW / 2, "not stalled in half a window", || {
        scenario.condition("Stalled").0 == "False"
    })
    .await;
    let stuck_since = scenario
        .status()
        .lag_window
        .and_then(|window| window.stuck_since)
        .expect("the stall's start is in status");
    scenario.stop_operator().await;
    (scenario, stuck_since)
}

fn millis(text: &str) -> i64 {
    text.parse::<Timestamp>()
        .expect("a timestamp")
        .as_millisecond()
}

#[tokio::test(start_paused = true)]
async fn a_fresh_operator_continues_the_window_from_status() {
    let (mut scenario, stuck_since) = half_a_window_stuck().await;
    scenario.start_operator();
    eventually(DEFAULT_WINDOW / 2 + 3 * LAG_INTERVAL, || {
        scenario.condition("Stalled").0 == "True"
    })
    .await;
    let now = crate::testapi::sim_clock();
    let window_ms = DEFAULT_WINDOW.as_millis() as i64;
    let late = now - (millis(&stuck_since) + window_ms);
    assert!(
        (0..=3 * LAG_INTERVAL.as_millis() as i64).contains(&late),
        "Stalled {late} ms after the window from {stuck_since} ended"
    );
    assert_eq!(
        scenario.condition("Stalled"),
        ("True".into(), "CommitsNotMoving".into())
    );
    let consuming = scenario.message("Consuming");
    assert!(consuming.contains(&stuck_since), "{consuming}");
    assert!(scenario.metrics().contains(
        r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 1"#
    ));
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn without_the_persisted_window_a_new_operator_would_start_over() {
    let (mut scenario, _) = half_a_window_stuck().await;
    scenario
        .server
        .edit_status::<ConsumerGroup>("ns", "billing", |group| {
            group["status"]["lagWindow"] = serde_json::Value::Null;
        });
    assert!(scenario.status().lag_window.is_none());
    scenario.start_operator();
    holds_for(
        DEFAULT_WINDOW / 2 + 2 * LAG_INTERVAL,
        "the judgement restarted: the persisted window is what carried it",
        || scenario.condition("Stalled").0 == "False",
    )
    .await;
    scenario.stop().await;
}
