//! A parked pull is answered as soon as a message is dispatched to its queue, long before its
//! suspend timeout; a pull on another queue stays parked until its own timeout.

mod common;

use std::time::{Duration, Instant};

use common::{pulled_bodies, test_config, TestBroker};
use quiver_protocol::code::response;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_pull_wakes_on_send() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut producer = broker.client().await;
    // Create the topic so the pull is valid.
    assert_eq!(
        producer.send("Wake", 0, "first", "A").await.code,
        response::SUCCESS
    );

    let addr = broker.addr;
    let parked = tokio::spawn(async move {
        let mut consumer = common::Client::connect(addr).await;
        let started = Instant::now();
        let reply = consumer.pull("G", "Wake", 0, 1, 15_000, None).await;
        (reply, started.elapsed())
    });
    broker.wait_parked(1).await;
    assert_eq!(
        producer.send("Wake", 0, "second", "A").await.code,
        response::SUCCESS
    );
    let (reply, waited) = parked.await.unwrap();
    assert_eq!(reply.code, response::SUCCESS);
    assert_eq!(pulled_bodies(&reply), vec!["second"]);
    // Well before the 15 s suspend timeout: the dispatch woke it, no polling interval.
    assert!(waited < Duration::from_secs(10), "woke after {waited:?}");

    // A short suspend with nothing sent ends with PULL_NOT_FOUND at its timeout.
    let mut idle = broker.client().await;
    let reply = idle.pull("G", "Wake", 0, 2, 300, None).await;
    assert_eq!(reply.code, response::PULL_NOT_FOUND);
    broker.stop().await;
}
