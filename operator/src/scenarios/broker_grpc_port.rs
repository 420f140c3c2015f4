//! The gRPC port of the 5.x clients: a new Broker's applied objects expose 8081 on the pods,
//! both Services and the NetworkPolicy, and each pod's config advertises its own gRPC address.

use super::{eventually, Scenario};
use crate::crd::{Broker, BrokerNetworkPolicy};
use crate::fixtures::BrokerFixture;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{json, Value};
use std::time::Duration;

fn port_named(ports: &Value, name: &str) -> Option<Value> {
    ports
        .as_array()?
        .iter()
        .find(|port| port["name"] == name)
        .cloned()
}

#[tokio::test(start_paused = true)]
async fn every_applied_object_exposes_the_grpc_port() {
    let scenario = Scenario::start(true).await;
    let mut broker = Broker::test().replicas(2).image("quiver:1");
    broker.spec.network_policy = Some(BrokerNetworkPolicy::default());
    scenario.create_broker(broker);
    let server = &scenario.server;
    eventually(Duration::from_secs(30), || {
        server.raw::<StatefulSet>("ns", "qb").is_some()
            && server.raw::<NetworkPolicy>("ns", "qb").is_some()
    })
    .await;

    let set = server.raw::<StatefulSet>("ns", "qb").unwrap();
    let container = &set["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        port_named(&container["ports"], "grpc"),
        Some(json!({"name": "grpc", "containerPort": 8081, "protocol": "TCP"}))
    );
    for service in ["qb-headless", "qb"] {
        let applied = server
            .raw::<Service>("ns", service)
            .expect("service applied");
        let grpc = port_named(&applied["spec"]["ports"], "grpc").expect(service);
        assert_eq!(
            (&grpc["port"], &grpc["targetPort"]),
            (&json!(8081), &json!("grpc"))
        );
    }

    let files = server
        .raw::<ConfigMap>("ns", "qb-config")
        .expect("config applied");
    for ordinal in 0..2 {
        let text = files["data"][format!("qb-{ordinal}.json")]
            .as_str()
            .unwrap();
        let config: Value = serde_json::from_str(text).unwrap();
        assert_eq!(config["grpc-listen"], "0.0.0.0:8081");
        assert_eq!(
            config["grpc-advertise"],
            format!("qb-{ordinal}.qb-headless.ns.svc:8081")
        );
    }

    let policy = server.raw::<NetworkPolicy>("ns", "qb").unwrap();
    let clients = &policy["spec"]["ingress"][0];
    assert_eq!(
        clients["ports"],
        json!([{"port": 10911, "protocol": "TCP"}, {"port": 8081, "protocol": "TCP"}]),
        "client namespaces reach both the remoting and the gRPC port"
    );
    scenario.stop().await;
}
