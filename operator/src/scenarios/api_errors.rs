//! API failures surface as errors that requeue with growing backoff; nothing panics.

use super::{context, stored_broker};
use crate::controller::broker::reconcile;
use crate::controller::{error_policy, BACKOFF_BASE};
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use kube::runtime::controller::Action;
use std::sync::Arc;

#[tokio::test]
async fn failed_apply_requeues_with_backoff_then_recovers() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Arc::new(Broker::test().replicas(2));
    api.insert(&paths::broker("qb"), broker.as_ref());

    api.fail_next("PATCH", &paths::statefulset("qb"), 500);
    let error = reconcile(broker.clone(), ctx.clone())
        .await
        .expect_err("apply fails");
    assert_eq!(error.metric_label(), "kube");
    assert!(
        error.to_string().contains("applying StatefulSet qb"),
        "{error}"
    );
    assert_eq!(
        error_policy(broker.clone(), &error, ctx.clone()),
        Action::requeue(BACKOFF_BASE)
    );

    api.fail_next("GET", &paths::statefulset("qb"), 503);
    let error = reconcile(broker.clone(), ctx.clone())
        .await
        .expect_err("read fails");
    assert_eq!(
        error_policy(broker.clone(), &error, ctx.clone()),
        Action::requeue(BACKOFF_BASE * 2)
    );

    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("recovers");
    assert!(api.get(&paths::statefulset("qb")).is_some());
    let error = reconcile(broker.clone(), ctx.clone()).await.err();
    assert!(error.is_none());
    api.fail_next("PATCH", &format!("{}/status", paths::broker("qb")), 500);
    let error = reconcile(broker.clone(), ctx.clone())
        .await
        .expect_err("status write fails");
    assert_eq!(
        error_policy(broker, &error, ctx.clone()),
        Action::requeue(BACKOFF_BASE),
        "success reset the backoff"
    );
    let metrics = ctx.metrics.encode();
    assert!(
        metrics.contains(r#"quiver_reconcile_errors_total{controller="broker",error="kube"} 3"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"quiver_reconcile_total{controller="broker"} 5"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_object_without_uid_is_an_error_not_a_panic() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let mut broker = Broker::test();
    broker.metadata.uid = None;
    let error = reconcile(Arc::new(broker), ctx).await.expect_err("refused");
    assert_eq!(error.metric_label(), "missing_field");
    assert!(error.to_string().contains("has no uid"), "{error}");
    assert!(
        api.requests().is_empty(),
        "nothing applied without owner references"
    );
}
