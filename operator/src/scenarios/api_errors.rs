//! API failures (500s and a 409 on the StatefulSet apply) surface as Degraded=True
//! ReconcileError with a Warning event, are retried with growing backoff, and the Broker
//! recovers on its own once the API answers.

use super::{condition, condition_message, eventually, Scenario};
use crate::controller::BACKOFF_BASE;
use crate::crd::Broker;
use crate::fixtures::{BrokerFixture, FakeAdmin};
use http::Method;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

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

    // Note when each attempt came: the gaps are the backoff.
    let mut attempts: Vec<Instant> = Vec::new();
    let mut seen = before;
    eventually(Duration::from_secs(120), || {
        while seen < applies() {
            seen += 1;
            attempts.push(Instant::now());
        }
        attempts.len() >= 4
    })
    .await;
    let gaps: Vec<Duration> = attempts.windows(2).map(|pair| pair[1] - pair[0]).collect();
    let at_least = [BACKOFF_BASE, BACKOFF_BASE * 2, BACKOFF_BASE * 4];
    for (gap, least) in gaps.iter().zip(at_least) {
        // Sampled each simulated second: a gap reads up to a second short.
        assert!(*gap + Duration::from_secs(1) >= least, "gaps {gaps:?}");
    }
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
