//! Scale-down makes the leaving brokers read-only and waits until every group consumed them.

use super::{addr, condition, condition_message, settle_statefulset, stored_broker, NOW_MS};
use crate::admin::BrokerPermission;
use crate::controller::broker::reconcile;
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use std::sync::Arc;

pub(super) fn sts_replicas(api: &FakeApiServer) -> i32 {
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    sts.spec.replicas.unwrap()
}

async fn three_settled_brokers() -> (FakeApiServer, Arc<FakeAdmin>, Arc<crate::Context>) {
    settled_brokers(3).await
}

/// A Broker of `replicas` brokers, created and every pod Ready.
pub(super) async fn settled_brokers(
    replicas: i32,
) -> (FakeApiServer, Arc<FakeAdmin>, Arc<crate::Context>) {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = super::context(client, admin.clone());
    let broker = Broker::test().replicas(replicas);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, replicas, replicas);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("settles");
    (api, admin, ctx)
}

#[tokio::test]
async fn replicas_drop_only_after_the_drain() {
    let (api, admin, ctx) = three_settled_brokers().await;
    admin.set_queue(
        &addr(2),
        "billing",
        ("orders", 0),
        100,
        Some(40),
        Some(NOW_MS - 1_000),
    );
    admin.set_queue(&addr(2), "audit", ("orders", 0), 100, Some(100), None);
    admin.set_queue(
        &addr(1),
        "billing",
        ("orders", 0),
        100,
        Some(0),
        Some(NOW_MS - 1_000),
    );

    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("starts drain");
    assert_eq!(
        sts_replicas(&api),
        3,
        "replicas kept while the leaving broker holds unconsumed messages"
    );
    assert_eq!(admin.permission(&addr(2)), Some(BrokerPermission::ReadOnly));
    assert_eq!(
        admin.permission(&addr(1)),
        None,
        "staying brokers untouched"
    );
    let status = stored_broker(&api).status.unwrap();
    let drain = status.drain.clone().expect("drain in status");
    assert_eq!(drain.brokers, vec!["qb-2"]);
    assert_eq!(drain.remaining_messages, 60);
    assert_eq!(drain.pending_groups, vec!["billing"]);
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "Draining".into())
    );

    let config = api.get(&paths::config_map("qb-config")).unwrap();
    let leaving: serde_json::Value =
        serde_json::from_str(config["data"]["qb-2.json"].as_str().unwrap()).unwrap();
    assert_eq!(
        leaving["broker-permission"], 4,
        "a restart mid-drain stays read-only"
    );
    let staying: serde_json::Value =
        serde_json::from_str(config["data"]["qb-1.json"].as_str().unwrap()).unwrap();
    assert!(staying.get("broker-permission").is_none());

    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("still draining");
    assert_eq!(
        api.event_reasons(),
        vec!["DrainStarted"],
        "draining restarts nothing"
    );
    assert_eq!(sts_replicas(&api), 3);

    admin.consume_all(&addr(2), "billing");
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("finishes drain");
    assert_eq!(sts_replicas(&api), 2);
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(status.drain, None);
    assert_eq!(status.current_replicas, 2);
    // The peer list in the config changed: the remaining brokers restart one at a time.
    assert_eq!(
        api.event_reasons(),
        vec!["DrainStarted", "Drained", "RolloutStarted"]
    );
}

#[tokio::test]
async fn scaling_back_up_mid_drain_makes_the_broker_writable_again() {
    let (api, admin, ctx) = three_settled_brokers().await;
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("starts drain");
    assert_eq!(admin.permission(&addr(2)), Some(BrokerPermission::ReadOnly));

    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 3.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("cancels drain");
    assert_eq!(
        admin.permission(&addr(2)),
        Some(BrokerPermission::ReadWrite)
    );
    assert_eq!(sts_replicas(&api), 3);
    assert_eq!(stored_broker(&api).status.unwrap().drain, None);
}

#[tokio::test]
async fn an_unreachable_leaving_broker_is_reported_and_an_image_fix_still_applies() {
    let (api, admin, ctx) = three_settled_brokers().await;
    // qb-2 crash-loops on a bad image: it answers nothing.
    admin.make_unreachable(&addr(2));
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into();
        broker["spec"]["image"] = "quiver:fixed".into();
        broker["metadata"]["generation"] = 2.into();
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("the drain of qb-2 fails alone, the pass goes on");
    assert_eq!(
        sts_replicas(&api),
        3,
        "no scale-down without a checked drain"
    );
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    assert_eq!(
        sts.spec.template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("quiver:fixed"),
        "the image fix is applied while the drain waits"
    );
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Degraded"),
        ("True".into(), "LeavingBrokerUnreachable".into())
    );
    let message = condition_message(&status.conditions, "Degraded");
    assert!(
        message.contains("qb-2")
            && message.contains("unreachable")
            && message.contains("connection refused"),
        "{message}"
    );
    let drain = status.drain.expect("still draining");
    assert_eq!(drain.unreachable_brokers, vec!["qb-2"]);
    assert!(api
        .event_reasons()
        .contains(&"LeavingBrokerUnreachable".to_string()));

    // The same failure on the next pass writes no new event.
    let events = api.event_reasons().len();
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("still waiting");
    assert_eq!(
        api.event_reasons().len(),
        events,
        "{:?}",
        api.event_reasons()
    );

    admin.make_reachable(&addr(2));
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("drains now");
    assert_eq!(sts_replicas(&api), 2);
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(condition(&status.conditions, "Degraded").0, "False");
}
