//! Deleting a ConsumerGroup: with deleteOffsetsOnDelete the group and its offsets are removed
//! from every broker before the finalizer goes; without it the brokers keep them. With a broker
//! down the deletion waits, visibly (deletionTimestamp set, Ready=False CleanupFailed naming the
//! broker, a Warning event), and completes once the broker answers again.

use super::group_support::{both, GroupScenario, FIRST_POLL};
use super::{addr, eventually, holds_for, LAG_INTERVAL};
use crate::admin::BrokerAddr;
use crate::controller::group::FINALIZER;
use crate::crd::ConsumerGroup;
use std::time::Duration;

/// Group billing polled on both brokers, its series exported.
async fn applied_group(delete_offsets: bool) -> GroupScenario {
    let scenario = GroupScenario::start().await;
    scenario
        .admin
        .set_queue(&addr(0), "billing", ("orders", 0), 10, Some(4), None);
    scenario.create_group(|group| group.spec.delete_offsets_on_delete = delete_offsets);
    eventually(FIRST_POLL, || scenario.polled()).await;
    assert!(scenario
        .metrics()
        .contains(r#"namespace="ns",cluster="qb",consumer_group="billing""#));
    scenario
}

fn delete(scenario: &GroupScenario) {
    scenario
        .server
        .delete::<ConsumerGroup>("ns", "billing")
        .expect("the delete is accepted");
}

fn deleted_on(scenario: &GroupScenario) -> Vec<BrokerAddr> {
    let deleted = scenario.admin.deleted();
    deleted.into_iter().map(|(addr, _)| addr).collect()
}

#[tokio::test(start_paused = true)]
async fn deletion_removes_the_group_and_its_offsets_then_the_finalizer() {
    let scenario = applied_group(true).await;
    delete(&scenario);
    eventually(Duration::from_secs(15), || scenario.stored().is_none()).await;
    let expected: Vec<BrokerAddr> = both().into_iter().map(BrokerAddr).collect();
    assert_eq!(deleted_on(&scenario), expected);
    assert!(scenario.admin.group(&addr(0), "billing").is_none());
    let metrics = scenario.metrics();
    assert!(
        !metrics.contains(r#"consumer_group="billing""#),
        "{metrics}"
    );
    scenario.event("GroupDeleted", "Normal");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn deletion_keeps_offsets_unless_asked_even_with_a_broker_down() {
    let scenario = applied_group(false).await;
    scenario.admin.make_unreachable(&addr(1));
    delete(&scenario);
    eventually(Duration::from_secs(15), || scenario.stored().is_none()).await;
    assert!(scenario.admin.deleted().is_empty());
    assert!(scenario.admin.group(&addr(0), "billing").is_some());
    let metrics = scenario.metrics();
    assert!(
        !metrics.contains(r#"consumer_group="billing""#),
        "{metrics}"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn with_a_broker_down_the_deletion_waits_visibly_then_completes() {
    let scenario = applied_group(true).await;
    scenario.admin.make_unreachable(&addr(1));
    delete(&scenario);

    // The object stays, marked for deletion, finalizer kept, and says why.
    eventually(Duration::from_secs(15), || {
        scenario.condition("Ready") == ("False".into(), "CleanupFailed".into())
    })
    .await;
    let group = scenario.group();
    assert!(group.metadata.deletion_timestamp.is_some());
    assert_eq!(group.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    let ready = scenario.message("Ready");
    assert!(
        ready.contains(&addr(1)) && ready.contains("deletion waits"),
        "{ready}"
    );
    let event = scenario.event("CleanupFailed", "Warning");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains(&addr(1)), "{event}");
    holds_for(
        4 * LAG_INTERVAL,
        "the object stays while the broker is down",
        || {
            scenario
                .stored()
                .is_some_and(|group| group.metadata.deletion_timestamp.is_some())
        },
    )
    .await;
    assert!(!deleted_on(&scenario).contains(&BrokerAddr(addr(1))));

    // The broker is back: the next retry deletes the group there and lets the object go.
    scenario.admin.make_reachable(&addr(1));
    eventually(Duration::from_secs(300), || scenario.stored().is_none()).await;
    assert!(deleted_on(&scenario).contains(&BrokerAddr(addr(1))));
    assert!(scenario.admin.group(&addr(1), "billing").is_none());
    assert!(scenario.admin.group(&addr(0), "billing").is_none());
    scenario.event("GroupDeleted", "Normal");
    let metrics = scenario.metrics();
    assert!(
        !metrics.contains(r#"consumer_group="billing""#),
        "{metrics}"
    );
    scenario.stop().await;
}
