//! A group's progress is judged over a wall-clock window: FallingBehind while lag keeps rising
//! with commits moving, Stalled once commits stop for the window, Stopped as soon as no
//! consumer is connected, CaughtUp when it consumed everything — each with a Warning event on
//! the way in and its series in `quiver_consumer_group_status`.

use super::group_support::{GroupScenario, FIRST_POLL, NEXT_POLL};
use super::{addr, eventually, holds_for, LAG_INTERVAL, NOW_MS};
use crate::crd::LagThresholds;
use crate::fixtures::FakeAdmin;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const WINDOW: Duration = Duration::from_secs(120);

fn status_series(scenario: &GroupScenario, status: &str) -> bool {
    let prefix = r#"quiver_consumer_group_status{namespace="ns",cluster="qb",consumer_group="billing",status=""#;
    scenario
        .metrics()
        .contains(&format!("{prefix}{status}\"}} 1"))
}

/// Producers outpace the consumer: every simulated second two messages stored, one committed.
fn start_traffic(admin: Arc<FakeAdmin>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for second in 0u64.. {
            let (stored, committed) = (100 + 2 * second, second);
            admin.set_queue(
                &addr(0),
                "billing",
                ("orders", 0),
                stored,
                Some(committed),
                Some(NOW_MS),
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

#[tokio::test(start_paused = true)]
async fn falling_behind_then_stalled_then_stopped_then_caught_up() {
    let scenario = GroupScenario::start().await;
    scenario
        .admin
        .set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    let traffic = start_traffic(scenario.admin.clone());
    scenario.create_group(|group| {
        group.spec.lag_thresholds = Some(LagThresholds {
            window_seconds: Some(WINDOW.as_secs()),
            ..LagThresholds::default()
        });
    });
    let consuming = || scenario.condition("Consuming");

    // Commits move but lag rises at every poll: FallingBehind once it did for a whole window.
    let started = Instant::now();
    eventually(FIRST_POLL, || scenario.polled()).await;
    assert_eq!(consuming(), ("True".into(), "Progressing".into()));
    holds_for(
        WINDOW - LAG_INTERVAL,
        "Progressing within the window",
        || consuming().1 == "Progressing",
    )
    .await;
    eventually(3 * LAG_INTERVAL, || consuming().1 == "FallingBehind").await;
    let took = started.elapsed();
    assert!(took >= WINDOW, "FallingBehind after {took:?}");
    assert_eq!(consuming().0, "True");
    assert!(status_series(&scenario, "warning"));
    scenario.event("FallingBehind", "Warning");

    // The consumer stops committing: Stalled once a whole window passed without a commit.
    traffic.abort();
    let frozen = Instant::now();
    holds_for(
        WINDOW - LAG_INTERVAL,
        "not stalled within the window",
        || consuming().1 != "Stalled",
    )
    .await;
    eventually(4 * LAG_INTERVAL, || consuming().1 == "Stalled").await;
    assert!(
        frozen.elapsed() >= WINDOW - LAG_INTERVAL,
        "{:?}",
        frozen.elapsed()
    );
    assert_eq!(consuming().0, "False");
    assert_eq!(scenario.condition("Stalled").0, "True");
    assert!(status_series(&scenario, "stalled"));
    scenario.event("Stalled", "Warning");

    // Its members leave: Stopped at the next poll.
    scenario.admin.set_members(&addr(0), "billing", &[]);
    eventually(NEXT_POLL, || {
        consuming() == ("False".into(), "Stopped".into())
    })
    .await;
    assert!(status_series(&scenario, "stopped"));
    assert_eq!(
        scenario.event_reasons(),
        vec!["FallingBehind", "Stalled", "Stopped"]
    );

    // Back, and it consumes everything.
    scenario
        .admin
        .set_members(&addr(0), "billing", &["10.0.0.8@1"]);
    scenario.admin.consume_all(&addr(0), "billing");
    eventually(NEXT_POLL, || {
        consuming() == ("True".into(), "CaughtUp".into())
    })
    .await;
    assert!(status_series(&scenario, "ok"));
    assert_eq!(
        scenario.event_reasons().len(),
        3,
        "no event for the way out"
    );
    scenario.stop().await;
}
