//! One queue stuck behind healthy ones: queue 0 of orders on qb-0 keeps its lag with no commit
//! while the group's other queues commit and their lag moves, so the group's sums move and it
//! is judged Progressing; after the window the status (QueuesStalled, stalledQueues) and the
//! metrics name the stuck queue, with a Warning event, until it commits.

use super::group_support::{GroupScenario, FIRST_POLL, NEXT_POLL};
use super::{addr, eventually};
use crate::crd::LagThresholds;
use crate::testapi::sim_clock;
use std::time::Duration;
use tokio::time::Instant;

const STALLED_QUEUES: &str =
    r#"quiver_consumer_group_stalled_queues{namespace="ns",cluster="qb",consumer_group="billing"}"#;
const STUCK_QUEUE_SINCE: &str = r#"quiver_consumer_queue_stalled_since_timestamp_seconds{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-0",queue_id="0"}"#;

/// The queues that commit: (orders, 1) on qb-0 and (orders, 0) on qb-1, `committed` read and a
/// few more stored (how many moves with each step).
fn consume_elsewhere(scenario: &GroupScenario, committed: u64) {
    let admin = &scenario.admin;
    let stored_at = Some(sim_clock() - 1_000);
    let wobble = (committed / 10) % 2;
    let billing = "billing";
    admin.set_queue(
        &addr(0),
        billing,
        ("orders", 1),
        committed + 3,
        Some(committed),
        stored_at,
    );
    let lag = 4 + wobble;
    admin.set_queue(
        &addr(1),
        billing,
        ("orders", 0),
        committed + lag,
        Some(committed),
        stored_at,
    );
}

#[tokio::test(start_paused = true)]
async fn a_stuck_queue_behind_healthy_ones_is_named_in_status_and_metrics() {
    let scenario = GroupScenario::start().await;
    let admin = &scenario.admin;
    let stuck_since_stored = Some(sim_clock() - 5_000);
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        45,
        Some(40),
        stuck_since_stored,
    );
    let mut committed = 100;
    consume_elsewhere(&scenario, committed);
    for ordinal in 0..2 {
        admin.set_members(&addr(ordinal), "billing", &["10.0.0.7@1"]);
    }
    let created = Instant::now();
    scenario.create_group(|group| {
        group.spec.lag_thresholds = Some(LagThresholds {
            window_seconds: Some(60),
            ..LagThresholds::default()
        });
    });
    eventually(FIRST_POLL, || scenario.polled()).await;

    // The other queues commit every 5 s; the group is never judged stalled.
    while scenario.condition("QueuesStalled").0 != "True" {
        assert!(
            created.elapsed() < Duration::from_secs(180),
            "the stuck queue never named: {:?}",
            scenario.status().conditions
        );
        assert_eq!(
            scenario.condition("Stalled").0,
            "False",
            "the group's sums move"
        );
        committed += 10;
        consume_elsewhere(&scenario, committed);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let took = created.elapsed();
    assert!(
        took >= Duration::from_secs(60),
        "named after {took:?}: within the window"
    );
    assert_eq!(
        scenario.condition("QueuesStalled"),
        ("True".into(), "QueueCommitsNotMoving".into())
    );
    assert_eq!(
        scenario.condition("Consuming"),
        ("True".into(), "Progressing".into())
    );
    let status = scenario.status();
    assert_eq!(status.stalled_queue_count, Some(1));
    let named: Vec<(&str, &str, i32, u64, u64)> = status
        .stalled_queues
        .iter()
        .map(|queue| {
            let (topic, broker) = (queue.topic.as_str(), queue.broker.as_str());
            (
                topic,
                broker,
                queue.queue_id,
                queue.lag,
                queue.committed_offset,
            )
        })
        .collect();
    assert_eq!(named, [("orders", "qb-0", 0, 5, 40)]);
    let message = scenario.message("QueuesStalled");
    assert!(
        message.contains("orders queue 0 on qb-0 (5 messages"),
        "{message}"
    );
    let metrics = scenario.metrics();
    assert!(
        metrics.contains(&format!("{STALLED_QUEUES} 1")),
        "{metrics}"
    );
    assert!(metrics.contains(STUCK_QUEUE_SINCE), "{metrics}");
    assert!(
        !metrics.contains(r#"quiver_consumer_queue_stalled_since_timestamp_seconds{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-0",queue_id="1"}"#),
        "only the stuck queue has a stalled series:\n{metrics}"
    );
    scenario.event("QueuesStalled", "Warning");

    // It commits: no longer named, its series gone.
    admin.set_queue(&addr(0), "billing", ("orders", 0), 45, Some(45), None);
    eventually(NEXT_POLL, || {
        scenario.condition("QueuesStalled").0 == "False"
    })
    .await;
    assert_eq!(scenario.status().stalled_queues, Vec::new());
    let metrics = scenario.metrics();
    assert!(
        metrics.contains(&format!("{STALLED_QUEUES} 0")),
        "{metrics}"
    );
    assert!(!metrics.contains(STUCK_QUEUE_SINCE), "{metrics}");
    scenario.stop().await;
}
