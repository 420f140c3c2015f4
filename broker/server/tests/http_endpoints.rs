//! The HTTP port: /healthz, /readyz and /metrics with the names of docs/METRICS.md.

mod common;

use common::{http_get, test_config, TestBroker};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    assert_eq!(http_get(broker.http, "/healthz").await.unwrap().0, 200);
    assert_eq!(http_get(broker.http, "/readyz").await.unwrap().0, 200);
    assert_eq!(http_get(broker.http, "/nothing").await.unwrap().0, 404);

    let mut client = broker.client().await;
    client.send("Met", 0, "m", "A").await;
    let metrics = broker.metrics().await;
    for name in [
        "rocketmq_messages_in_total",
        "rocketmq_throughput_in_total",
        "rocketmq_messages_out_total",
        "rocketmq_throughput_out_total",
        "rocketmq_consumer_lag_messages",
        "rocketmq_consumer_lag_latency",
        "quiver_consumer_committed_offset",
        "quiver_store_disk_used_bytes",
        "quiver_store_disk_total_bytes",
        "quiver_store_commitlog_bytes",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{metrics}"
        );
    }
    let cluster = "{cluster=\"DefaultCluster\"}";
    assert!(metrics.contains(&format!("quiver_broker_ready{cluster} 1")));
    assert!(metrics.contains(&format!("quiver_broker_writable{cluster} 1")));
    assert!(metrics.contains(&format!("quiver_connections{cluster} 1")));
    assert!(metrics
        .contains("rocketmq_throughput_in_total{cluster=\"DefaultCluster\",topic=\"Met\"} 1"));

    // Nothing committed: no lag series (unknown is not zero).
    assert!(
        !metrics.contains("rocketmq_consumer_lag_messages{"),
        "{metrics}"
    );
    client.pull("G", "Met", 0, 0, 0, Some(0)).await;
    let metrics = broker.metrics().await;
    assert!(metrics.contains(
        "rocketmq_consumer_lag_messages{cluster=\"DefaultCluster\",consumer_group=\"G\",topic=\"Met\"} 1"
    ));
    let latency = metrics
        .lines()
        .find(|l| l.starts_with("rocketmq_consumer_lag_latency{"))
        .expect("latency series");
    let value: i64 = latency.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 0);
    broker.stop().await;
}
