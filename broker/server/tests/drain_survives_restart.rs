//! brokerPermission set by UPDATE_BROKER_CONFIG survives a restart: a drained broker does not
//! start taking sends again because its pod restarted.

mod common;

use bytes::Bytes;
use common::{test_config, TestBroker};
use quiver_protocol::code::{request, response};

async fn set_permission(client: &mut common::Client, permission: u32) {
    let body = Bytes::from(format!("brokerPermission={permission}\n"));
    let reply = client
        .call(request::UPDATE_BROKER_CONFIG, Default::default(), body)
        .await;
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drained_broker_stays_drained() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    assert_eq!(
        client.send("Drain", 0, "a", "A").await.code,
        response::SUCCESS
    );
    set_permission(&mut client, 4).await;
    broker.stop().await;

    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    assert_eq!(
        client.send("Drain", 0, "b", "A").await.code,
        response::NO_PERMISSION
    );
    assert!(broker
        .metrics()
        .await
        .contains("quiver_broker_writable{cluster=\"DefaultCluster\"} 0"));
    let pulled = client.pull("G", "Drain", 0, 0, 0, None).await;
    assert_eq!(common::pulled_bodies(&pulled), vec!["a"]);
    set_permission(&mut client, 6).await;
    assert_eq!(
        client.send("Drain", 0, "c", "A").await.code,
        response::SUCCESS
    );
    broker.stop().await;
}
