//! A new Broker gets every object, applied server-side and owned by it, a status that goes from
//! starting to Ready, and its spec topics created on every broker once Ready.

use super::{addr, condition, eventually, Scenario};
use crate::crd::Broker;
use crate::fixtures::BrokerFixture;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Resource;
use serde_json::Value;
use std::time::Duration;

fn owner_kind(object: Option<Value>) -> Value {
    let object = object.expect("object applied");
    object["metadata"]["ownerReferences"][0]["kind"].clone()
}

#[tokio::test(start_paused = true)]
async fn creates_every_object_then_reports_ready() {
    let scenario = Scenario::start(true).await;
    scenario.create_broker(Broker::test().replicas(3).image("quiver:1").full_spec());
    eventually(Duration::from_secs(30), || {
        scenario.server.raw::<StatefulSet>("ns", "qb").is_some()
            && scenario.broker().status.is_some()
    })
    .await;
    let status = scenario.status();
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("True".into(), "BrokersStarting".into())
    );
    let server = &scenario.server;
    for owned in [
        owner_kind(server.raw::<StatefulSet>("ns", "qb")),
        owner_kind(server.raw::<ConfigMap>("ns", "qb-config")),
        owner_kind(server.raw::<Service>("ns", "qb-headless")),
        owner_kind(server.raw::<Service>("ns", "qb")),
        owner_kind(server.raw::<PodDisruptionBudget>("ns", "qb")),
    ] {
        assert_eq!(owned, Broker::kind(&()).as_ref());
    }
    assert!(
        scenario.admin.topics(&addr(0)).is_empty(),
        "no topic calls before the brokers are Ready"
    );

    eventually(Duration::from_secs(300), || scenario.broker_ready()).await;
    let status = scenario.status();
    assert_eq!((status.ready_replicas, status.brokers.len()), (3, 3));
    assert_eq!(status.brokers[2].address, addr(2));
    assert_eq!(
        condition(&status.conditions, "Ready"),
        ("True".into(), "AllBrokersReady".into())
    );
    assert_eq!(condition(&status.conditions, "Degraded").0, "False");
    eventually(Duration::from_secs(60), || {
        scenario.admin.topic_creates() == 3
    })
    .await;
    for ordinal in 0..3 {
        let topics = scenario.admin.topics(&addr(ordinal));
        assert_eq!((topics[0].name.as_str(), topics[0].queues), ("orders", 4));
    }
    tokio::time::sleep(Duration::from_secs(600)).await;
    assert_eq!(
        scenario.admin.topic_creates(),
        3,
        "existing topics are not recreated"
    );
    scenario.stop().await;
}
