//! A broker reporting a full disk sets DiskPressure (one Warning event, the storage expansion to
//! make) and it clears once the broker has room again; a broker that cannot tell leaves it
//! Unknown. Neither fails the reconcile.

use super::{addr, condition, condition_message, eventually, Scenario};
use crate::crd::Broker;
use crate::fixtures::{disk_report, BrokerFixture};
use std::time::Duration;

fn disk_pressure(scenario: &Scenario) -> (String, String) {
    condition(&scenario.status().conditions, "DiskPressure")
}

#[tokio::test(start_paused = true)]
async fn a_full_disk_sets_disk_pressure_until_the_broker_has_room_again() {
    let scenario = Scenario::settled(2).await;
    assert_eq!(disk_pressure(&scenario), ("False".into(), "DiskOK".into()));
    let admin = &scenario.admin;
    admin.set_runtime_info(&addr(1), Some(disk_report(0.93, Some("disk-high-water"))));
    // Found on the next idle requeue at the latest.
    eventually(Duration::from_secs(330), || {
        disk_pressure(&scenario) == ("True".into(), "DiskAboveHighWater".into())
    })
    .await;
    let message = condition_message(&scenario.status().conditions, "DiskPressure");
    for part in [
        "qb-1: disk 93% used of 90% high water",
        "refuses sends (disk-high-water",
        "raise spec.storage.size (now 10Gi)",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    assert_eq!(condition(&scenario.status().conditions, "Ready").0, "True");
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_eq!(
        scenario.events("DiskPressure").len(),
        1,
        "no repeated warning"
    );
    scenario.event("DiskPressure", "Warning");

    admin.set_runtime_info(&addr(1), Some(disk_report(0.47, None)));
    // Checked again every 30 s while the pressure lasts.
    eventually(Duration::from_secs(40), || {
        disk_pressure(&scenario) == ("False".into(), "DiskOK".into())
    })
    .await;
    scenario.event("DiskPressureRelieved", "Normal");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_broker_that_cannot_tell_leaves_disk_pressure_unknown() {
    let scenario = Scenario::start(true).await;
    scenario.admin.set_runtime_info(&addr(0), None);
    scenario.create_broker(Broker::test().image("quiver:1"));
    eventually(Duration::from_secs(300), || scenario.broker_ready()).await;
    assert_eq!(
        disk_pressure(&scenario),
        ("Unknown".into(), "DiskUsageUnknown".into())
    );
    let message = condition_message(&scenario.status().conditions, "DiskPressure");
    assert!(
        message.contains("qb-0 (older broker without GET_BROKER_RUNTIME_INFO)"),
        "{message}"
    );
    assert!(scenario.events("DiskPressure").is_empty());
    scenario.stop().await;
}
