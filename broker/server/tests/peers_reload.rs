//! A broker follows the `peers` of its config file while it runs: started alone, it lists a
//! second broker in its routes and cluster info once its file names it, and drops it once the
//! file no longer does; a file that does not parse keeps the peers and is counted.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ext, start_binary, test_config, wait_for, Client, TestBroker};
use quiver_protocol::code::{request, response};

/// What a reload may take: the file check (2 s) and the next peer poll (2 s), with margin.
const LIMIT: Duration = Duration::from_secs(20);

/// Broker names in the cluster info of the broker at `addr`.
async fn cluster_names(addr: std::net::SocketAddr) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    let reply = client
        .call(
            request::GET_BROKER_CLUSTER_INFO,
            Default::default(),
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
    let info: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let mut names: Vec<String> = info["brokerAddrTable"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    names.sort();
    names
}

/// Broker names in the route of `topic` the broker at `addr` answers; empty when it has none.
async fn route_names(addr: std::net::SocketAddr, topic: &str) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    let reply = client
        .call(
            request::GET_ROUTEINFO_BY_TOPIC,
            ext(&[("topic", topic)]),
            Bytes::new(),
        )
        .await;
    if reply.code != response::SUCCESS {
        return Vec::new();
    }
    let route: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    route["brokerDatas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|broker| broker["brokerName"].as_str().unwrap().to_string())
        .collect()
}

/// The `quiver_peers_reloads_total` sample with this result.
fn reloads(metrics: &str, result: &str) -> Option<u64> {
    metrics
        .lines()
        .filter(|line| line.starts_with("quiver_peers_reloads_total{"))
        .find(|line| line.contains(&format!("result=\"{result}\"")))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

async fn metrics_of(http: std::net::SocketAddr) -> String {
    common::http_get(http, "/metrics")
        .await
        .expect("metrics answered")
        .1
}

fn write_peers(path: &std::path::Path, peers: &[String]) {
    let text = serde_json::json!({ "broker-name": "broker-a", "peers": peers }).to_string();
    std::fs::write(path, text).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_started_alone_follows_the_peers_of_its_config_file() {
    let dir_b = tempfile::tempdir().unwrap();
    let b = TestBroker::start(quiver_broker::BrokerConfig {
        broker_name: "broker-b".into(),
        ..test_config(dir_b.path())
    })
    .await;
    let created = b.client().await.create_topic("OnB", 2).await;
    assert_eq!(created.code, response::SUCCESS);

    let dir_a = tempfile::tempdir().unwrap();
    let file = dir_a.path().join("broker-a.json");
    write_peers(&file, &[]);
    let log = dir_a.path().join("broker.log");
    let data = dir_a.path().join("data");
    let args = [
        "--config",
        file.to_str().unwrap(),
        "--auto-create-topics",
        "false",
    ];
    let a = start_binary(&data, &log, &args).await;
    assert_eq!(cluster_names(a.addr).await, ["broker-a"]);
    assert!(route_names(a.addr, "OnB").await.is_empty());

    write_peers(&file, &[b.addr.to_string()]);
    wait_for(
        "broker-b in broker-a's cluster and route",
        LIMIT,
        || async {
            cluster_names(a.addr).await == ["broker-a", "broker-b"]
                && route_names(a.addr, "OnB").await == ["broker-b"]
        },
    )
    .await;

    std::fs::write(&file, "{ not json").unwrap();
    wait_for("the failed reload counted", LIMIT, || async {
        reloads(&metrics_of(a.http).await, "failed") == Some(1)
    })
    .await;
    assert_eq!(
        cluster_names(a.addr).await,
        ["broker-a", "broker-b"],
        "kept"
    );

    write_peers(&file, &[]);
    wait_for(
        "broker-b gone from broker-a's cluster and route",
        LIMIT,
        || async {
            cluster_names(a.addr).await == ["broker-a"]
                && route_names(a.addr, "OnB").await.is_empty()
        },
    )
    .await;
    let metrics = metrics_of(a.http).await;
    assert_eq!(reloads(&metrics, "ok"), Some(2), "{metrics}");
    assert_eq!(reloads(&metrics, "failed"), Some(1), "{metrics}");
    drop(a);
    b.stop().await;
}
