//! Offsets committed by pull piggy-back and by UPDATE_CONSUMER_OFFSET (two-way and oneway).

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ext, ext_u64, test_config, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_via_pull_and_update() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    for i in 0..4 {
        client.send("Offs", 0, &format!("m{i}"), "A").await;
    }
    let none = client.query_offset("G", "Offs", 0).await;
    assert_eq!(none.code, response::QUERY_NOT_FOUND);

    // Piggy-back: commitOffset with sysFlag bit 1.
    let pulled = client.pull("G", "Offs", 0, 2, 0, Some(2)).await;
    assert_eq!(pulled.code, response::SUCCESS);
    assert_eq!(
        ext_u64(&client.query_offset("G", "Offs", 0).await, "offset"),
        2
    );

    // Two-way UPDATE_CONSUMER_OFFSET.
    let fields = ext(&[
        ("consumerGroup", "G"),
        ("topic", "Offs"),
        ("queueId", "0"),
        ("commitOffset", "3"),
    ]);
    let reply = client
        .call(request::UPDATE_CONSUMER_OFFSET, fields, Bytes::new())
        .await;
    assert_eq!(reply.code, response::SUCCESS);
    assert_eq!(
        ext_u64(&client.query_offset("G", "Offs", 0).await, "offset"),
        3
    );

    // Oneway: no answer, but the commit lands.
    let fields = ext(&[
        ("consumerGroup", "G"),
        ("topic", "Offs"),
        ("queueId", "0"),
        ("commitOffset", "4"),
    ]);
    let oneway = RemotingCommand::request(request::UPDATE_CONSUMER_OFFSET, fields)
        .with_opaque(9_999)
        .into_oneway();
    client.write(&oneway).await;
    common::wait_for("oneway commit", Duration::from_secs(10), || async {
        let mut probe = broker.client().await;
        probe.query_offset("G", "Offs", 0).await.ext("offset") == Some("4")
    })
    .await;
    // The next response on this connection is for the next request, not the oneway.
    let max = client
        .call(
            request::GET_MAX_OFFSET,
            ext(&[("topic", "Offs"), ("queueId", "0")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(ext_u64(&max, "offset"), 4);
    assert_ne!(max.opaque, 9_999);

    let metrics = broker.metrics().await;
    assert!(
        metrics.contains("rocketmq_consumer_lag_messages{cluster=\"DefaultCluster\",consumer_group=\"G\",topic=\"Offs\"} 0"),
        "{metrics}"
    );
    broker.stop().await;
}
