//! A volume expansion that stops: a claim the storage driver does not resize degrades the Broker
//! (ProgressDeadlineExceeded, naming the claim, with a Warning event) once
//! spec.progressDeadlineSeconds pass without a claim resized; resized at last, it clears.

use super::{condition_message, eventually, holds_for, Scenario};
use crate::crd::Broker;
use crate::fixtures::BrokerFixture;
use std::time::Duration;

fn degraded(scenario: &Scenario) -> Option<(String, String)> {
    scenario.condition("Degraded")
}

#[tokio::test(start_paused = true)]
async fn a_stuck_volume_expansion_degrades_the_broker_naming_the_claim() {
    let scenario = Scenario::start(true).await;
    let mut broker = Broker::test().replicas(2).image("quiver:1");
    broker.spec.progress_deadline_seconds = 120;
    scenario.create_broker(broker);
    eventually(Duration::from_secs(300), || scenario.broker_ready()).await;

    scenario.server.stall_resize("ns", "data-qb-1");
    scenario.edit_broker(|broker| broker["spec"]["storage"]["size"] = "20Gi".into());
    eventually(Duration::from_secs(60), || {
        scenario
            .status()
            .storage
            .is_some_and(|storage| storage.resized_claims == 1)
    })
    .await;
    // The deadline counts from the last claim resized: not before.
    holds_for(
        Duration::from_secs(60),
        "no Degraded before the deadline",
        || degraded(&scenario).is_some_and(|(status, _)| status == "False"),
    )
    .await;
    eventually(Duration::from_secs(300), || {
        degraded(&scenario) == Some(("True".into(), "ProgressDeadlineExceeded".into()))
    })
    .await;
    let message = condition_message(&scenario.status().conditions, "Degraded");
    assert!(
        message.contains("volume expansion to 20Gi")
            && message.contains("claim data-qb-1 still has 10Gi")
            && !message.contains("data-qb-0"),
        "{message}"
    );
    let warning = scenario.event("ProgressDeadlineExceeded", "Warning");
    assert!(
        warning["note"]
            .as_str()
            .is_some_and(|note| note.contains("data-qb-1")),
        "{warning}"
    );
    assert_eq!(
        scenario.condition("VolumeExpansion"),
        Some(("True".into(), "Expanding".into()))
    );

    // The driver recovers: the claim grows and Degraded clears.
    scenario.server.resume_resize("ns", "data-qb-1");
    eventually(Duration::from_secs(120), || {
        scenario.condition("VolumeExpansion") == Some(("True".into(), "VolumesExpanded".into()))
            && degraded(&scenario).is_some_and(|(status, _)| status == "False")
    })
    .await;
    scenario.stop().await;
}
