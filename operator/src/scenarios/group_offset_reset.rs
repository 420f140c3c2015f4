//! An offset reset in the spec is applied once on every broker, recorded in
//! status.appliedOffsetReset with an OffsetsReset event, and not repeated on later polls; a new
//! id is applied at once; a reset waits while a broker does not answer.

use super::group_support::{GroupScenario, FIRST_POLL, NEXT_POLL};
use super::{addr, eventually, holds_for, LAG_INTERVAL};
use crate::admin::{BrokerAddr, ResetTarget};
use crate::crd::{OffsetResetSpec, OffsetResetTarget};
use std::time::Duration;

fn replay(group: &mut crate::crd::ConsumerGroup) {
    group.spec.offset_reset = Some(OffsetResetSpec {
        id: "replay-1".into(),
        to: OffsetResetTarget::Earliest,
        timestamp_millis: None,
    });
}

#[tokio::test(start_paused = true)]
async fn a_reset_applies_once_per_id_on_every_broker() {
    let scenario = GroupScenario::with_one_queue(100, Some(100), None).await;
    let admin = &scenario.admin;
    scenario.create_group(replay);

    eventually(FIRST_POLL, || scenario.polled()).await;
    let resets = admin.resets();
    let brokers: Vec<BrokerAddr> = resets.iter().map(|(addr, ..)| addr.clone()).collect();
    assert_eq!(brokers, vec![BrokerAddr(addr(0)), BrokerAddr(addr(1))]);
    assert!(resets
        .iter()
        .all(|(_, group, topic, target)| group == "billing"
            && topic == "orders"
            && *target == ResetTarget::Earliest));
    let status = scenario.status();
    let applied = status.applied_offset_reset.expect("recorded");
    assert_eq!(
        (applied.id.as_str(), applied.to),
        ("replay-1", OffsetResetTarget::Earliest)
    );
    assert_eq!(
        status.total_lag,
        Some(100),
        "lag reflects the rewound offsets"
    );
    let event = scenario.event("OffsetsReset", "Normal");
    assert!(
        event["note"]
            .as_str()
            .unwrap_or_default()
            .contains("replay-1"),
        "{event}"
    );

    // Later polls do not apply the same id again.
    let polls = scenario.polls();
    holds_for(4 * LAG_INTERVAL, "one reset per id", || {
        admin.resets().len() == 2
    })
    .await;
    assert!(scenario.polls() >= polls + 3, "polled meanwhile");
    assert_eq!(scenario.event_reasons(), vec!["OffsetsReset"]);

    // A new id is a new spec: applied at once.
    scenario.edit_group(|group| {
        group["spec"]["offsetReset"] = serde_json::json!({"id": "skip-1", "to": "Latest"});
    });
    eventually(Duration::from_secs(10), || admin.resets().len() == 4).await;
    eventually(Duration::from_secs(10), || {
        scenario.status().total_lag == Some(0)
    })
    .await;
    let applied = scenario.status().applied_offset_reset.expect("recorded");
    assert_eq!(applied.id, "skip-1");
    holds_for(2 * LAG_INTERVAL, "one reset per id", || {
        admin.resets().len() == 4
    })
    .await;
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_reset_waits_while_a_broker_does_not_answer() {
    let scenario = GroupScenario::start().await;
    let admin = &scenario.admin;
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(100), None);
    admin.set_queue(&addr(1), "billing", ("orders", 0), 40, Some(40), None);
    admin.make_unreachable(&addr(1));
    scenario.create_group(replay);

    eventually(FIRST_POLL, || scenario.polled()).await;
    let polls = scenario.polls();
    holds_for(4 * LAG_INTERVAL, "no half-applied reset", || {
        admin.resets().is_empty() && scenario.status().applied_offset_reset.is_none()
    })
    .await;
    assert!(scenario.polls() >= polls + 3, "polled meanwhile");
    assert!(!scenario
        .event_reasons()
        .contains(&"OffsetsReset".to_string()));

    admin.make_reachable(&addr(1));
    eventually(NEXT_POLL, || {
        scenario.status().applied_offset_reset.is_some()
    })
    .await;
    assert_eq!(admin.resets().len(), 2, "on both brokers, once");
    assert_eq!(scenario.status().total_lag, Some(140));
    scenario.event("OffsetsReset", "Normal");
    holds_for(2 * LAG_INTERVAL, "one reset per id", || {
        admin.resets().len() == 2
    })
    .await;
    scenario.stop().await;
}
