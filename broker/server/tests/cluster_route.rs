//! Three brokers on loopback with --peers: each answers the same route listing all three,
//! and a broker set read-only (brokerPermission 4) takes no sends but keeps serving pulls.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ext, pulled_bodies, test_config, TestBroker};
use quiver_protocol::code::{request, response};
use tokio::net::TcpListener;

async fn route(broker: &TestBroker, topic: &str) -> serde_json::Value {
    let mut client = broker.client().await;
    let reply = client
        .call(
            request::GET_ROUTEINFO_BY_TOPIC,
            ext(&[("topic", topic)]),
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
    serde_json::from_slice(&reply.body).unwrap()
}

/// (brokerName, address, perm) of each broker in a route, sorted.
fn members(route: &serde_json::Value) -> Vec<(String, String, u64)> {
    let mut out: Vec<_> = route["brokerDatas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            let name = b["brokerName"].as_str().unwrap().to_string();
            let perm = route["queueDatas"]
                .as_array()
                .unwrap()
                .iter()
                .find(|q| q["brokerName"] == b["brokerName"])
                .unwrap()["perm"]
                .as_u64()
                .unwrap();
            (
                name,
                b["brokerAddrs"]["0"].as_str().unwrap().to_string(),
                perm,
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_brokers_share_one_route() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        let remoting = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listeners.push((remoting, http));
    }
    let addrs: Vec<String> = listeners
        .iter()
        .map(|(l, _)| l.local_addr().unwrap().to_string())
        .collect();
    let mut brokers = Vec::new();
    for (i, (remoting, http)) in listeners.into_iter().enumerate() {
        let config = quiver_broker::BrokerConfig {
            broker_name: format!("broker-{i}"),
            advertise: Some(addrs[i].clone()),
            listen: addrs[i].clone(),
            http_listen: http.local_addr().unwrap().to_string(),
            peers: addrs.clone(),
            ..test_config(dirs[i].path())
        };
        brokers.push(TestBroker::start_on(config, remoting, http).await);
    }
    for broker in &brokers {
        let mut client = broker.client().await;
        let created = client.create_topic("Shared", 2).await;
        assert_eq!(created.code, response::SUCCESS);
    }
    let expected: Vec<(String, String, u64)> = (0..3)
        .map(|i| (format!("broker-{i}"), addrs[i].clone(), 6))
        .collect();
    for broker in &brokers {
        common::wait_for(
            "a route with all three brokers",
            Duration::from_secs(15),
            || async { members(&route(broker, "Shared").await) == expected },
        )
        .await;
    }

    // Drain broker-2: its queues turn read-only in every route; it refuses sends, serves pulls.
    let mut drained = brokers[2].client().await;
    assert_eq!(
        drained.send("Shared", 0, "kept", "A").await.code,
        response::SUCCESS
    );
    let update = drained
        .call(
            request::UPDATE_BROKER_CONFIG,
            Default::default(),
            Bytes::from_static(b"brokerPermission=4\n"),
        )
        .await;
    assert_eq!(update.code, response::SUCCESS, "{:?}", update.remark);
    let refused = drained.send("Shared", 0, "new", "A").await;
    assert_eq!(refused.code, response::NO_PERMISSION);
    assert_eq!(
        pulled_bodies(&drained.pull("G", "Shared", 0, 0, 0, None).await),
        vec!["kept"]
    );
    let mut read_only = expected.clone();
    read_only[2].2 = 4;
    for broker in &brokers {
        common::wait_for(
            "broker-2 read-only in the route",
            Duration::from_secs(15),
            || async { members(&route(broker, "Shared").await) == read_only },
        )
        .await;
    }
    let info = drained
        .call(
            request::GET_BROKER_CLUSTER_INFO,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let info: serde_json::Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(
        info["clusterAddrTable"]["DefaultCluster"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    for broker in brokers {
        broker.stop().await;
    }
}
