//! A new leader continues the judgement from status: the window's runs are persisted, so a
//! fresh Context declares Stalled exactly when the old one would have.

use super::group_support::{poll_after, simulated_context, two_brokers};
use super::{addr, condition, stored_group, LAG_INTERVAL};
use crate::controller::group::{DEFAULT_WINDOW, FINALIZER};
use crate::controller::Context;
use crate::crd::ConsumerGroup;
use crate::fixtures::{paths, simulated_clock, FakeAdmin, FakeApiServer, GroupFixture};
use std::sync::Arc;

fn stuck_group(api: &FakeApiServer, admin: &FakeAdmin) {
    two_brokers(api);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    api.insert(&paths::group("billing"), &group);
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(40), None);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
}

#[tokio::test]
async fn a_fresh_context_continues_the_window_from_status() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let old_leader = simulated_context(client.clone(), admin.clone());
    stuck_group(&api, &admin);
    // Half a window with the old leader: not stalled yet.
    let half = DEFAULT_WINDOW.as_secs() / LAG_INTERVAL.as_secs() / 2;
    for _ in 0..=half {
        poll_after(&api, &old_leader, LAG_INTERVAL)
            .await
            .expect("polls");
    }
    let status = stored_group(&api).status.expect("status");
    assert_eq!(condition(&status.conditions, "Stalled").0, "False");
    let stuck_since = status
        .lag_window
        .as_ref()
        .and_then(|window| window.stuck_since.clone())
        .expect("the stall's start is in status");
    drop(old_leader);

    // A new leader, with nothing in memory, after the other half of the window.
    let now = simulated_clock();
    let new_leader = Arc::new(
        Context::new(client, admin.clone(), Arc::default(), LAG_INTERVAL)
            .with_clock(simulated_clock),
    );
    poll_after(&api, &new_leader, DEFAULT_WINDOW / 2)
        .await
        .expect("polls");
    assert!(simulated_clock() > now);
    let status = stored_group(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Stalled"),
        ("True".into(), "CommitsNotMoving".into())
    );
    let consuming = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Consuming")
        .unwrap();
    assert!(
        consuming.message.contains(&stuck_since),
        "{}",
        consuming.message
    );
    assert!(new_leader.metrics.encode().contains(
        r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 1"#
    ));
}

#[tokio::test]
async fn without_the_persisted_window_a_new_leader_would_start_over() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let old_leader = simulated_context(client.clone(), admin.clone());
    stuck_group(&api, &admin);
    for _ in 0..DEFAULT_WINDOW.as_secs() / LAG_INTERVAL.as_secs() / 2 {
        poll_after(&api, &old_leader, LAG_INTERVAL)
            .await
            .expect("polls");
    }
    api.edit(&paths::group("billing"), |group| {
        group["status"]["lagWindow"] = serde_json::Value::Null;
    });
    let new_leader = Arc::new(
        Context::new(client, admin.clone(), Arc::default(), LAG_INTERVAL)
            .with_clock(simulated_clock),
    );
    poll_after(&api, &new_leader, DEFAULT_WINDOW / 2)
        .await
        .expect("polls");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Stalled").0,
        "False",
        "the judgement restarted: the persisted window is what carried it"
    );
}
