//! An offset reset is applied exactly once on each broker: each broker's reset call is recorded
//! in status before it is made, so a failed status write (before or after the calls) never makes
//! a retry call it again; and a call the record shows interrupted is not made again once the
//! group's offsets moved there (it could rewind consumers that moved past the reset).

use super::addr;
use super::group_support::{GroupScenario, FIRST_POLL};
use super::{eventually, holds_for, LAG_INTERVAL};
use crate::admin::BrokerAddr;
use crate::crd::{OffsetResetSpec, OffsetResetTarget};
use http::Method;
use serde_json::json;
use std::time::Duration;

const STATUS: &str = "/apis/quiver.io/v1alpha1/namespaces/ns/consumergroups/billing/status";

fn replay(group: &mut crate::crd::ConsumerGroup) {
    group.spec.offset_reset = Some(OffsetResetSpec {
        id: "replay-1".into(),
        to: OffsetResetTarget::Earliest,
        timestamp_millis: None,
    });
}

/// Both brokers hold queue (orders, 0) of billing, consumed to the end.
fn caught_up(scenario: &GroupScenario) {
    for ordinal in 0..2 {
        let admin = &scenario.admin;
        admin.set_queue(
            &addr(ordinal),
            "billing",
            ("orders", 0),
            100,
            Some(100),
            None,
        );
    }
}

fn reset_brokers(scenario: &GroupScenario) -> Vec<BrokerAddr> {
    let resets = scenario.admin.resets();
    resets.into_iter().map(|(addr, ..)| addr).collect()
}

#[tokio::test(start_paused = true)]
async fn a_reset_whose_status_writes_fail_is_applied_once_on_each_broker() {
    let scenario = GroupScenario::start().await;
    caught_up(&scenario);
    // The first status write of the group fails, and so does the one that records the reset
    // applied, after both brokers' calls (the fifth: the failed poll's status, the records
    // before the two calls, then the record of the reset applied).
    scenario.server.fail_next(Method::PATCH, STATUS, 1, 500);
    scenario.server.fail_after(Method::PATCH, STATUS, 3, 1, 500);
    scenario.create_group(replay);

    eventually(FIRST_POLL + Duration::from_secs(120), || {
        scenario.status().applied_offset_reset.is_some()
    })
    .await;
    assert_eq!(
        reset_brokers(&scenario),
        vec![BrokerAddr(addr(0)), BrokerAddr(addr(1))],
        "once on each broker"
    );
    let status = scenario.status();
    assert_eq!(status.offset_reset_in_progress, None, "{status:?}");
    let applied = status.applied_offset_reset.expect("recorded");
    assert_eq!(
        (applied.id.as_str(), applied.unconfirmed_on.len()),
        ("replay-1", 0)
    );
    assert!(
        scenario.status_writes() >= 7,
        "the failures happened: {} status writes",
        scenario.status_writes()
    );
    eventually(2 * LAG_INTERVAL, || {
        scenario.status().total_lag == Some(200)
    })
    .await;
    holds_for(4 * LAG_INTERVAL, "one reset per broker", || {
        scenario.admin.resets().len() == 2
    })
    .await;
    scenario.event("OffsetsReset", "Normal");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_interrupted_reset_is_not_made_again_where_offsets_moved_since() {
    let mut scenario = GroupScenario::without_broker().await;
    scenario.create_broker();
    caught_up(&scenario);
    scenario.create_group(replay);
    // What an operator that stopped during broker 0's call left: the call recorded, its outcome
    // not, and the offsets there no longer those recorded before it.
    scenario
        .server
        .edit_status::<crate::crd::ConsumerGroup>("ns", "billing", |group| {
            group["status"] = json!({"offsetResetInProgress": {
                "id": "replay-1",
                "applying": {"broker": addr(0), "offsetsDigest": "digest-before-the-call"},
            }});
        });
    scenario.start_operator();

    eventually(FIRST_POLL, || {
        scenario.status().applied_offset_reset.is_some()
    })
    .await;
    assert_eq!(
        reset_brokers(&scenario),
        vec![BrokerAddr(addr(1))],
        "broker 0 is not reset a second time"
    );
    let applied = scenario.status().applied_offset_reset.expect("recorded");
    assert_eq!(applied.unconfirmed_on, vec![addr(0)]);
    let warning = scenario.event("OffsetResetUnconfirmed", "Warning");
    let note = warning["note"].as_str().unwrap_or_default();
    assert!(
        note.contains(&addr(0)) && note.contains("new spec.offsetReset.id"),
        "{note}"
    );
    let reset = scenario.event("OffsetsReset", "Normal");
    let note = reset["note"].as_str().unwrap_or_default();
    assert!(note.contains("not confirmed on"), "{note}");
    holds_for(2 * LAG_INTERVAL, "no further call", || {
        scenario.admin.resets().len() == 1
    })
    .await;
    scenario.stop().await;
}
