//! A new Broker gets every object, applied server-side and owned by it, and a status.

use super::{condition, context, settle_statefulset, stored_broker};
use crate::controller::broker::{reconcile, IDLE_REQUEUE, PROGRESS_REQUEUE};
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::runtime::controller::Action;
use std::sync::Arc;

#[tokio::test]
async fn creates_every_object_then_reports_ready() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(3);
    api.insert(&paths::broker("qb"), &broker);

    let action = reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(
        action,
        Action::requeue(PROGRESS_REQUEUE),
        "pods are starting"
    );

    let requests = api.requests();
    assert_eq!(requests[0], format!("GET {}", paths::statefulset("qb")));
    for path in [
        paths::config_map("qb-config"),
        paths::service("qb-headless"),
        paths::service("qb"),
        paths::pdb("qb"),
        paths::statefulset("qb"),
    ] {
        assert!(
            requests.contains(&format!("PATCH {path}")),
            "{path} not applied: {requests:?}"
        );
        let owner = &api.get(&path).expect("object stored")["metadata"]["ownerReferences"][0];
        assert_eq!(owner["kind"], "Broker");
        assert_eq!(owner["controller"], true);
    }
    assert_eq!(
        requests.last().unwrap(),
        &format!("PATCH {}/status", paths::broker("qb"))
    );
    let sts: StatefulSet = api.object(&paths::statefulset("qb"));
    assert_eq!(sts.spec.replicas, Some(3));

    let status = stored_broker(&api).status.expect("status written");
    assert_eq!(status.observed_generation, Some(1));
    assert_eq!(status.brokers.len(), 3);
    assert_eq!(status.brokers[2].address, "qb-2.qb-headless.ns.svc:10911");
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("False".into(), "BrokersNotReady".into())
    );
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "BrokersStarting".into())
    );

    settle_statefulset(&api, 3, 3);
    let action = reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("reconciles");
    assert_eq!(action, Action::requeue(IDLE_REQUEUE));
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(status.ready_replicas, 3);
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("True".into(), "AllBrokersReady".into())
    );
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("False".into(), "Stable".into())
    );
    assert_eq!(condition(&status.conditions, "Degraded").0, "False");
}

#[tokio::test]
async fn spec_topics_are_created_on_every_ready_broker() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let broker = Broker::test().replicas(2).full_spec();
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("reconciles");
    assert!(
        admin.topics(&super::addr(0)).is_empty(),
        "no topic calls before the brokers are Ready"
    );

    settle_statefulset(&api, 2, 2);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(admin.topic_creates(), 2);
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("reconciles again");
    assert_eq!(
        admin.topic_creates(),
        2,
        "existing topics are not recreated"
    );
    for ordinal in 0..2 {
        let topics = admin.topics(&super::addr(ordinal));
        assert_eq!(topics.len(), 1);
        assert_eq!((topics[0].name.as_str(), topics[0].queues), ("orders", 4));
    }
}
