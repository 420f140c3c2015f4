//! Delayed messages not yet due hold a scale-down: they sit in the schedule topic, which no
//! group commits on, and would go with the broker.

use super::{addr, eventually, holds_for, Scenario, NOW_MS};
use crate::controller::drain::SCHEDULE_TOPIC;
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn delayed_messages_not_yet_due_hold_the_leaving_broker() {
    let scenario = Scenario::settled(2).await;
    // Level 18 (two hours): stored a minute before the start, due in about two hours.
    let stored = (SCHEDULE_TOPIC, 17);
    scenario
        .admin
        .set_topic_queue(&addr(1), stored, (0, 3), Some(NOW_MS - 60_000));
    // Level 1 (one second), stored an hour ago: delivered long since.
    let delivered = (SCHEDULE_TOPIC, 0);
    scenario
        .admin
        .set_topic_queue(&addr(1), delivered, (0, 9), Some(NOW_MS - 3_600_000));
    scenario.scale_to(1);
    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    let drain = scenario.status().drain.expect("draining");
    assert_eq!(drain.pending_topics, [SCHEDULE_TOPIC]);
    assert_eq!(drain.messages_without_group, 0);
    holds_for(
        Duration::from_secs(300),
        "two brokers while messages are due",
        || scenario.sts_replicas() == 2,
    )
    .await;
    scenario.stop().await;
}
