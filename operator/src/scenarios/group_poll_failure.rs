//! A failed lag poll is visible, not just logged: Ready=False with reason PollFailed and the
//! cause, a Warning event, the lag series dropped and `quiver_lag_poll_success` 0 — and the
//! reconcile still fails, for backoff. Repeating the same failure does not rewrite status.

use super::group_support::{poll_after, polls, simulated_context, status_writes, two_brokers};
use super::{addr, condition, stored_group, LAG_INTERVAL, NOW_MS};
use crate::controller::Context;
use crate::crd::ConsumerGroup;
use crate::fixtures::{paths, FakeAdmin, FakeApiServer, GroupFixture};
use std::sync::Arc;
use std::time::Duration;

const POLL_SUCCESS: &str =
    r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"}"#;

async fn polled_group() -> (FakeApiServer, Arc<FakeAdmin>, Arc<Context>) {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    two_brokers(&api);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![crate::controller::group::FINALIZER.to_string()]);
    api.insert(&paths::group("billing"), &group);
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        100,
        Some(90),
        Some(NOW_MS),
    );
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    poll_after(&api, &ctx, LAG_INTERVAL)
        .await
        .expect("first poll");
    let metrics = ctx.metrics.encode();
    assert!(metrics.contains(&format!("{POLL_SUCCESS} 1")), "{metrics}");
    assert!(
        metrics.contains("rocketmq_consumer_lag_messages{"),
        "{metrics}"
    );
    (api, admin, ctx)
}

fn assert_lag_unknown(ctx: &Context) {
    let metrics = ctx.metrics.encode();
    assert!(metrics.contains(&format!("{POLL_SUCCESS} 0")), "{metrics}");
    for gone in [
        "rocketmq_consumer_lag_messages{",
        "rocketmq_consumer_lag_latency{",
        "quiver_consumer_queue_lag_messages{",
        "quiver_consumer_group_status{",
        "quiver_consumer_group_stalled{",
    ] {
        assert!(!metrics.contains(gone), "{gone} still exported:\n{metrics}");
    }
}

#[tokio::test]
async fn no_broker_answering_is_a_condition_an_event_and_no_lag_series() {
    let (api, admin, ctx) = polled_group().await;
    admin.make_unreachable(&addr(0));
    admin.make_unreachable(&addr(1));

    let error = poll_after(&api, &ctx, LAG_INTERVAL)
        .await
        .expect_err("the reconcile fails, for backoff");
    assert_eq!(error.metric_label(), "finalizer");
    let status = stored_group(&api).status.expect("status");
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("False".into(), "PollFailed".into())
    );
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert!(
        ready.message.contains("reaching any broker") && ready.message.contains("unreachable"),
        "{}",
        ready.message
    );
    for type_ in ["Lagging", "Consuming", "Stalled"] {
        assert_eq!(
            condition(&status.conditions, type_),
            ("Unknown".into(), "PollFailed".into())
        );
    }
    assert_eq!(status.total_lag, None, "unknown, not the last value");
    assert!(
        status.lag_window.is_some(),
        "the judgement's memory is kept"
    );
    assert_eq!(api.event_reasons(), vec!["PollFailed"]);
    assert_lag_unknown(&ctx);

    // The backoff retry, seconds later, polls again; the same failure writes nothing new.
    let (writes, polled) = (status_writes(&api), polls(&api));
    poll_after(&api, &ctx, Duration::from_secs(5))
        .await
        .expect_err("still failing");
    assert_eq!(
        polls(&api),
        polled + 1,
        "retried, not held until the interval"
    );
    assert_eq!(status_writes(&api), writes);

    // Back: lag, series and Ready return.
    admin.make_reachable(&addr(0));
    admin.make_reachable(&addr(1));
    poll_after(&api, &ctx, LAG_INTERVAL).await.expect("polls");
    let status = stored_group(&api).status.unwrap();
    assert_eq!(condition(&status.conditions, "Ready").0, "True");
    assert_eq!(status.total_lag, Some(10));
    assert!(ctx.metrics.encode().contains(&format!("{POLL_SUCCESS} 1")));
}

#[tokio::test]
async fn an_api_error_reading_the_broker_is_surfaced_the_same_way() {
    let (api, _admin, ctx) = polled_group().await;
    api.fail_next("GET", &paths::broker("qb"), 500);
    poll_after(&api, &ctx, LAG_INTERVAL)
        .await
        .expect_err("the reconcile fails");
    let status = stored_group(&api).status.unwrap();
    let ready = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert_eq!(ready.reason, "PollFailed");
    assert!(
        ready.message.contains("reading Broker qb"),
        "{}",
        ready.message
    );
    assert_eq!(api.event_reasons(), vec!["PollFailed"]);
    assert_lag_unknown(&ctx);
}
