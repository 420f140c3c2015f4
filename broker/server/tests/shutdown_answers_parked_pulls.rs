//! Stopping the broker answers parked pulls at once (not at their suspend timeout) and still
//! exits cleanly, with offsets persisted.

mod common;

use std::time::{Duration, Instant};

use common::{test_config, TestBroker};
use quiver_protocol::code::response;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_pulls_are_answered_on_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    assert_eq!(
        client.send("Stop", 0, "m", "A").await.code,
        response::SUCCESS
    );
    let addr = broker.addr;
    let parked = tokio::spawn(async move {
        let mut consumer = common::Client::connect(addr).await;
        let started = Instant::now();
        // Commits offset 1 and parks for up to 30 s.
        let reply = consumer.pull("G", "Stop", 0, 1, 30_000, Some(1)).await;
        (reply.code, started.elapsed())
    });
    broker.wait_parked(1).await;
    broker.stop().await;
    let (code, waited) = parked.await.unwrap();
    assert_eq!(code, response::PULL_NOT_FOUND);
    assert!(
        waited < Duration::from_secs(20),
        "answered after {waited:?}"
    );

    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let committed = client.query_offset("G", "Stop", 0).await;
    assert_eq!(committed.ext("offset"), Some("1"));
    broker.stop().await;
}
