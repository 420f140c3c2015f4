//! A lagging group is polled once per lag interval, however often it is woken, and its status
//! is written at most once per poll — never when nothing a user reads changed.

use super::group_support::{
    poll_after, polls, reconcile_until_quiet, simulated_context, status_writes, two_brokers,
};
use super::{addr, stored_group, LAG_INTERVAL, NOW_MS};
use crate::controller::group::{reconcile, FINALIZER};
use crate::crd::ConsumerGroup;
use crate::fixtures::{advance_simulated_clock, paths, FakeAdmin, FakeApiServer, GroupFixture};
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

/// Intervals in 10 simulated minutes.
const TEN_MINUTES: u64 = 600 / LAG_INTERVAL.as_secs();

fn lagging_group(api: &FakeApiServer, admin: &FakeAdmin) {
    two_brokers(api);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    api.insert(&paths::group("billing"), &group);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
}

#[tokio::test]
async fn a_lagging_group_writes_status_at_most_once_per_interval() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    lagging_group(&api, &admin);
    for interval in 0..TEN_MINUTES {
        // Producers outpace the consumer: lag and its age change at every poll.
        let committed = 10 * interval;
        admin.set_queue(
            &addr(0),
            "billing",
            ("orders", 0),
            100 + 20 * interval,
            Some(committed),
            Some(NOW_MS - 1_000),
        );
        let (polls_before, writes_before) = (polls(&api), status_writes(&api));
        let action = reconcile_until_quiet(&api, &ctx).await.expect("polls");
        assert_eq!(action, Action::requeue(LAG_INTERVAL), "interval {interval}");
        assert_eq!(
            polls(&api) - polls_before,
            1,
            "one poll in interval {interval}"
        );
        assert!(
            status_writes(&api) - writes_before <= 1,
            "interval {interval}: {} writes",
            status_writes(&api) - writes_before
        );
        // Woken mid-interval (a resync, another field's change): no poll, requeued for the rest.
        advance_simulated_clock(Duration::from_secs(5));
        let early = reconcile(Arc::new(stored_group(&api)), ctx.clone())
            .await
            .expect("early wake");
        assert_eq!(
            early,
            Action::requeue(LAG_INTERVAL - Duration::from_secs(5))
        );
        assert_eq!(polls(&api) - polls_before, 1, "no extra poll");
        advance_simulated_clock(LAG_INTERVAL - Duration::from_secs(5));
    }
    assert!(status_writes(&api) as u64 <= TEN_MINUTES);
}

#[tokio::test]
async fn a_quiet_group_is_never_written_again() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    lagging_group(&api, &admin);
    // Caught up and idle.
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(100), None);
    reconcile_until_quiet(&api, &ctx).await.expect("first poll");
    let after_first = status_writes(&api);
    for _ in 0..TEN_MINUTES {
        poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    }
    assert_eq!(
        status_writes(&api),
        after_first,
        "nothing changed, nothing written"
    );
}

#[tokio::test]
async fn a_stalled_group_of_unknown_age_stops_writing_once_judged() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    lagging_group(&api, &admin);
    // Lag that never moves, and no store time to age it: status settles once Stalled.
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(40), None);
    for _ in 0..=TEN_MINUTES {
        poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    }
    let judged = stored_group(&api).status.expect("status");
    assert!(
        judged
            .conditions
            .iter()
            .any(|c| c.type_ == "Stalled" && c.status == "True"),
        "{:?}",
        judged.conditions
    );
    let writes = status_writes(&api);
    for _ in 0..TEN_MINUTES {
        poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    }
    assert_eq!(status_writes(&api), writes);
}
