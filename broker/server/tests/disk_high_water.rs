//! A broker whose disk is above the high-water mark: sends are refused with
//! SERVICE_NOT_AVAILABLE and a remark naming the disk, while pulls, offset commits, runtime
//! info, /readyz and /metrics go on and say why.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{http_get, pulled_bodies, test_config, TestBroker};
use quiver_protocol::body::KvTable;
use quiver_protocol::code::{request, response};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn above_high_water_sends_are_refused_and_reads_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    for i in 0..3 {
        let sent = client.send("Hw", 0, &format!("m{i}"), "").await;
        assert_eq!(sent.code, response::SUCCESS, "{sent:?}");
    }
    broker.stop().await;

    // Any real disk is above this mark.
    let config = quiver_broker::BrokerConfig {
        disk_high_water_ratio: 1e-9,
        disk_check_interval_ms: 50,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut client = broker.client().await;
    let refused = client.send("Hw", 0, "late", "").await;
    assert_eq!(refused.code, response::SERVICE_NOT_AVAILABLE, "{refused:?}");
    let remark = refused.remark.clone().unwrap_or_default();
    let data_dir = dir.path().display().to_string();
    assert!(
        remark.contains("disk full") && remark.contains(&data_dir) && remark.contains("% used"),
        "{remark}"
    );

    // Reads and offset commits go on.
    let pulled = client.pull("G", "Hw", 0, 0, 0, Some(0)).await;
    assert_eq!(pulled.code, response::SUCCESS, "{pulled:?}");
    assert_eq!(pulled_bodies(&pulled), ["m0", "m1", "m2"]);
    let committed = client.pull("G", "Hw", 0, 3, 0, Some(3)).await;
    assert_ne!(committed.code, response::SYSTEM_ERROR, "{committed:?}");
    let offset = client.query_offset("G", "Hw", 0).await;
    assert_eq!(offset.ext("offset"), Some("3"), "{offset:?}");

    let info = client
        .call(
            request::GET_BROKER_RUNTIME_INFO,
            Default::default(),
            Bytes::new(),
        )
        .await;
    assert_eq!(info.code, response::SUCCESS);
    let table = KvTable::decode(&info.body).unwrap().table;
    assert_eq!(table["quiverWritable"], "false");
    assert_eq!(table["quiverWriteRefusal"], "disk-high-water");
    assert!(table["quiverWriteRefusalMessage"].contains(&data_dir));
    let ratio: f64 = table["commitLogDiskRatio"].parse().unwrap();
    assert!(ratio > 0.0 && ratio <= 1.0, "{ratio}");
    assert!(table["commitLogDirCapacity"].starts_with("Total : "));

    let (status, body) = http_get(broker.http, "/readyz").await.unwrap();
    assert_eq!(status, 200, "consumers must still reach a read-only broker");
    assert!(
        body.starts_with("ready, read-only (disk-high-water)"),
        "{body}"
    );
    let metrics = broker.metrics().await;
    for line in [
        "quiver_store_writable{cluster=\"DefaultCluster\"} 0",
        "quiver_store_write_refusal{cluster=\"DefaultCluster\",reason=\"disk-high-water\"} 1",
        "quiver_store_write_refusals_total{cluster=\"DefaultCluster\",reason=\"disk-high-water\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} missing from\n{metrics}");
    }
    tokio::time::timeout(Duration::from_secs(10), broker.stop())
        .await
        .expect("a read-only broker stops cleanly");
}
