//! A clean restart keeps messages, committed offsets, topics and subscription groups.

mod common;

use bytes::Bytes;
use common::{ext, ext_u64, pulled_bodies, test_config, TestBroker};
use quiver_protocol::code::{request, response};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_messages_offsets_topics() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let created = client.create_topic("Kept", 3).await;
    assert_eq!(created.code, response::SUCCESS);
    let group = br#"{"groupName":"KeptGroup","retryMaxTimes":3,"consumeEnable":true}"#;
    let created = client
        .call(
            request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            Default::default(),
            Bytes::from_static(group),
        )
        .await;
    assert_eq!(created.code, response::SUCCESS);
    for i in 0..3 {
        client.send("Kept", 2, &format!("m{i}"), "A").await;
    }
    client.pull("G", "Kept", 2, 0, 0, Some(2)).await;
    broker.stop().await;

    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let pulled = client.pull("G", "Kept", 2, 0, 0, None).await;
    assert_eq!(pulled_bodies(&pulled), vec!["m0", "m1", "m2"]);
    assert_eq!(
        ext_u64(&client.query_offset("G", "Kept", 2).await, "offset"),
        2
    );
    let route = client
        .call(
            request::GET_ROUTEINFO_BY_TOPIC,
            ext(&[("topic", "Kept")]),
            Bytes::new(),
        )
        .await;
    let route: serde_json::Value = serde_json::from_slice(&route.body).unwrap();
    assert_eq!(route["queueDatas"][0]["writeQueueNums"], 3);
    let groups = client
        .call(
            request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let groups: serde_json::Value = serde_json::from_slice(&groups.body).unwrap();
    assert_eq!(
        groups["subscriptionGroupTable"]["KeptGroup"]["retryMaxTimes"],
        3
    );
    broker.stop().await;
}
