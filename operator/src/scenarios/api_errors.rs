//! API failures (500s and a 409 on the StatefulSet apply) surface as Degraded=True
//! ReconcileError with a Warning event, are retried with a backoff that doubles, and the Broker
//! recovers on its own once the API answers.

use super::{condition, condition_message, eventually, Scenario};
use crate::controller::BACKOFF_BASE;
use crate::crd::Broker;
use crate::fixtures::{BrokerFixture, FakeAdmin};
use http::Method;
use std::sync::Arc;
use std::time::Duration;

const STATEFULSET: &str = "/apis/apps/v1/namespaces/ns/statefulsets/qb";

#[tokio::test(start_paused = true)]
async fn failed_applies_are_reported_retried_with_backoff_and_recovered_from() {
    let scenario = Scenario::settled(2).await;
    let server = &scenario.server;
    server.fail_next(Method::PATCH, STATEFULSET, 2, 500);
    server.fail_next(Method::PATCH, STATEFULSET, 1, 409);
    let applies = || server.request_count("patch", "statefulsets", "qb", "");
    let before = applies();
    scenario.set_image("quiver:2");

    // Retried with a backoff that grows: 5 s, then 10 s, then 20 s (the policy itself is
    // tested in controller::tests); nothing else wakes the Broker meanwhile (its status writes
    // do not, nothing it owns changes), so the waits between attempts are the backoff's.
    eventually(Duration::from_secs(300), || applies() >= before + 4).await;
    let attempts: Vec<i64> = server
        .requests()
        .iter()
        .filter(|r| {
            (
                r.verb.as_str(),
                r.resource.as_str(),
                r.name.as_str(),
                r.subresource.as_str(),
            ) == ("patch", "statefulsets", "qb", "")
        })
        .skip(before)
        .take(4)
        .map(|request| request.at_ms)
        .collect();
    let waits: Vec<Duration> = attempts
        .windows(2)
        .map(|pair| Duration::from_millis(u64::try_from(pair[1] - pair[0]).unwrap_or(0)))
        .collect();
    assert_eq!(
        waits,
        [BACKOFF_BASE, BACKOFF_BASE * 2, BACKOFF_BASE * 4],
        "each retry waits twice as long as the one before"
    );
    let events = scenario.events("ReconcileError");
    assert!(
        !events.is_empty() && events[0]["type"] == "Warning",
        "{events:?}"
    );
    let note = events[0]["note"].as_str().unwrap_or_default();
    assert!(note.contains("applying StatefulSet qb"), "{note}");

    eventually(Duration::from_secs(900), || {
        scenario.pods_ready_on(2, "quiver:2") && scenario.broker_ready()
    })
    .await;
    assert_eq!(
        condition(&scenario.status().conditions, "Degraded").0,
        "False"
    );
    let metrics = scenario.ctx.metrics.encode();
    assert!(
        metrics.contains(r#"quiver_reconcile_errors_total{controller="broker",error="kube"} 3"#),
        "{metrics}"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_failure_shows_in_the_condition_while_it_lasts() {
    let scenario = Scenario::settled(1).await;
    scenario
        .server
        .fail_next(Method::PATCH, STATEFULSET, 100, 500);
    scenario.set_image("quiver:2");
    eventually(Duration::from_secs(60), || {
        condition(&scenario.status().conditions, "Degraded")
            == ("True".into(), "ReconcileError".into())
    })
    .await;
    let message = condition_message(&scenario.status().conditions, "Degraded");
    assert!(message.contains("injected failure (500)"), "{message}");
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_object_without_uid_is_an_error_not_a_panic() {
    let server = crate::testapi::TestApiServer::start().await;
    let ctx = super::sim_context(&server, Arc::new(FakeAdmin::default()));
    let mut broker = Broker::test();
    broker.metadata.uid = None;
    let error = crate::controller::broker::reconcile(Arc::new(broker), ctx)
        .await
        .expect_err("refused");
    assert_eq!(error.metric_label(), "missing_field");
    assert!(
        server.requests().is_empty(),
        "nothing applied without owner references"
    );
}
