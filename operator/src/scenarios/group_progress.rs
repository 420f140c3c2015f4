//! A group's progress is judged over a wall-clock window: FallingBehind while lag keeps rising
//! with commits moving, Stalled once commits stop for the window, Stopped as soon as no
//! consumer is connected, CaughtUp when it consumed everything — each with a Warning event on
//! the way in and its series in `quiver_consumer_group_status`.

use super::group_support::{poll_after, simulated_context, two_brokers};
use super::{addr, condition, stored_group, LAG_INTERVAL, NOW_MS};
use crate::controller::Context;
use crate::crd::{ConsumerGroup, LagThresholds};
use crate::fixtures::{paths, FakeAdmin, FakeApiServer, GroupFixture};
use std::sync::Arc;
use std::time::Duration;

const WINDOW: Duration = Duration::from_secs(120);

fn consuming(api: &FakeApiServer) -> (String, String) {
    condition(
        &stored_group(api).status.expect("status").conditions,
        "Consuming",
    )
}

fn status_series(ctx: &Context, status: &str) -> String {
    let prefix = r#"quiver_consumer_group_status{namespace="ns",cluster="qb",consumer_group="billing",status=""#;
    let line = format!("{prefix}{status}\"}} 1");
    assert!(
        ctx.metrics.encode().contains(&line),
        "missing {line} in\n{}",
        ctx.metrics.encode()
    );
    line
}

/// Group billing judged over [`WINDOW`], with one member connected.
fn group_with_a_member(api: &FakeApiServer, admin: &FakeAdmin) {
    two_brokers(api);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![crate::controller::group::FINALIZER.to_string()]);
    group.spec.lag_thresholds = Some(LagThresholds {
        window_seconds: Some(WINDOW.as_secs()),
        ..LagThresholds::default()
    });
    api.insert(&paths::group("billing"), &group);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
}

#[tokio::test]
async fn falling_behind_then_stalled_then_stopped_then_caught_up() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    group_with_a_member(&api, &admin);
    let polls_per_window = WINDOW.as_secs() / LAG_INTERVAL.as_secs();

    // Commits move, but producers add twice as much: lag rises at every poll.
    let mut committed = 0;
    let mut stored = 100;
    for poll in 0..=polls_per_window {
        admin.set_queue(
            &addr(0),
            "billing",
            ("orders", 0),
            stored,
            Some(committed),
            Some(NOW_MS),
        );
        poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
        let expected = if poll < polls_per_window {
            "Progressing"
        } else {
            "FallingBehind"
        };
        assert_eq!(
            consuming(&api),
            ("True".into(), expected.into()),
            "poll {poll}"
        );
        committed += 10;
        stored += 20;
    }
    status_series(&ctx, "warning");
    assert_eq!(api.event_reasons(), vec!["FallingBehind"]);

    // The consumer stops committing: Stalled once a whole window passed without a commit.
    let frozen = committed - 10;
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        stored,
        Some(frozen),
        Some(NOW_MS),
    );
    // No commit since the last loop poll: one poll short of a window, then a whole one.
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    poll_after(&api, &ctx, WINDOW - 2 * LAG_INTERVAL)
        .await
        .expect("polls");
    assert_ne!(consuming(&api).1, "Stalled", "one poll short of the window");
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    assert_eq!(consuming(&api), ("False".into(), "Stalled".into()));
    let status = stored_group(&api).status.unwrap();
    assert_eq!(condition(&status.conditions, "Stalled").0, "True");
    status_series(&ctx, "stalled");

    // Its members leave: Stopped at once.
    admin.set_members(&addr(0), "billing", &[]);
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    assert_eq!(consuming(&api), ("False".into(), "Stopped".into()));
    status_series(&ctx, "stopped");
    assert_eq!(
        api.event_reasons(),
        vec!["FallingBehind", "Stalled", "Stopped"]
    );

    // Back, and it consumes everything.
    admin.set_members(&addr(0), "billing", &["10.0.0.8@1"]);
    admin.consume_all(&addr(0), "billing");
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    assert_eq!(consuming(&api), ("True".into(), "CaughtUp".into()));
    status_series(&ctx, "ok");
}
