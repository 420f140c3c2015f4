//! Deleting a ConsumerGroup removes it from its brokers (when asked) before the finalizer goes.

use super::{addr, context, stored_group, NOW_MS};
use crate::admin::BrokerAddr;
use crate::controller::group::{reconcile, FINALIZER};
use crate::crd::{Broker, BrokerStatus, ConsumerGroup};
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer, GroupFixture};
use kube::runtime::controller::Action;
use std::sync::Arc;

async fn applied_group(
    delete_offsets: bool,
) -> (FakeApiServer, Arc<FakeAdmin>, Arc<crate::Context>) {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let broker = Broker::test().replicas(2).with_status(BrokerStatus {
        current_replicas: 2,
        ..BrokerStatus::default()
    });
    api.insert(&paths::broker("qb"), &broker);
    let mut group = ConsumerGroup::test();
    group.spec.delete_offsets_on_delete = delete_offsets;
    api.insert(&paths::group("billing"), &group);
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        10,
        Some(4),
        Some(NOW_MS),
    );
    reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("adds finalizer");
    reconcile(Arc::new(stored_group(&api)), ctx.clone())
        .await
        .expect("applies");
    assert!(ctx
        .metrics
        .encode()
        .contains(r#"namespace="ns",cluster="qb",consumer_group="billing""#));
    (api, admin, ctx)
}

fn mark_deleted(api: &FakeApiServer) {
    api.edit(&paths::group("billing"), |group| {
        group["metadata"]["deletionTimestamp"] = "2026-11-29T12:00:00Z".into();
    });
}

#[tokio::test]
async fn deletion_removes_the_group_and_its_offsets_then_the_finalizer() {
    let (api, admin, ctx) = applied_group(true).await;
    assert_eq!(
        stored_group(&api).metadata.finalizers,
        Some(vec![FINALIZER.to_string()])
    );
    mark_deleted(&api);
    let action = reconcile(Arc::new(stored_group(&api)), ctx.clone())
        .await
        .expect("cleans up");
    assert_eq!(action, Action::await_change());
    let deleted: Vec<BrokerAddr> = admin.deleted().into_iter().map(|(addr, _)| addr).collect();
    assert_eq!(deleted, vec![BrokerAddr(addr(0)), BrokerAddr(addr(1))]);
    assert!(admin.group(&addr(0), "billing").is_none());
    assert!(
        api.get(&paths::group("billing")).is_none(),
        "finalizer removed, object gone"
    );
    assert!(
        !ctx.metrics.encode().contains(r#"consumer_group="billing""#),
        "series removed"
    );
}

#[tokio::test]
async fn deletion_keeps_offsets_unless_asked() {
    let (api, admin, ctx) = applied_group(false).await;
    mark_deleted(&api);
    reconcile(Arc::new(stored_group(&api)), ctx)
        .await
        .expect("cleans up");
    assert!(admin.deleted().is_empty());
    assert!(admin.group(&addr(0), "billing").is_some());
    assert!(api.get(&paths::group("billing")).is_none());
}

#[tokio::test]
async fn a_failing_broker_keeps_the_finalizer_for_a_retry() {
    let (api, admin, ctx) = applied_group(true).await;
    admin.make_unreachable(&addr(1));
    mark_deleted(&api);
    let error = reconcile(Arc::new(stored_group(&api)), ctx)
        .await
        .expect_err("cleanup fails");
    assert_eq!(error.metric_label(), "finalizer");
    assert_eq!(
        stored_group(&api).metadata.finalizers,
        Some(vec![FINALIZER.to_string()])
    );
}
