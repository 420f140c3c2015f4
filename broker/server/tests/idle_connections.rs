//! A connection that sends nothing for idle-connection-timeout-ms is closed and counted; one
//! that keeps sending, or waits on a parked pull of its own, is not; others keep working.

mod common;

use std::time::{Duration, Instant};

use common::{test_config, Client, TestBroker};
use quiver_protocol::code::response;

const IDLE_TIMEOUT_MS: u64 = 1_000;

async fn broker() -> (TestBroker, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        idle_connection_timeout_ms: IDLE_TIMEOUT_MS,
        ..test_config(dir.path())
    };
    (TestBroker::start(config).await, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_and_a_busy_one_is_not() {
    let (broker, _dir) = broker().await;
    let mut busy = broker.client().await;
    let mut silent = Client::connect(broker.addr).await;
    let opened = Instant::now();
    // The busy one sends every 300 ms, well within the timeout, for three timeouts.
    let mut sent = 0;
    while opened.elapsed() < Duration::from_millis(3 * IDLE_TIMEOUT_MS) {
        let answer = busy.send("Idle", 0, &format!("m{sent}"), "A").await;
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(silent.read().await.is_none(), "the silent one was closed");
    let answer = busy.send("Idle", 0, "last", "A").await;
    assert_eq!(answer.code, response::SUCCESS, "the busy one still works");
    let metrics = broker.metrics().await;
    let closed = |reason: &str| common::connections_closed(&metrics, reason);
    assert!(closed("idle") >= 1, "{metrics}");
    assert_eq!(closed("max-connections"), 0);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_pull_keeps_its_connection_open_past_the_timeout() {
    let (broker, _dir) = broker().await;
    let mut producer = broker.client().await;
    assert_eq!(
        producer.send("Park", 0, "a", "A").await.code,
        response::SUCCESS
    );
    let mut consumer = broker.client().await;
    let started = Instant::now();
    // Parked at the max offset for three timeouts, with nothing else sent on the connection.
    let suspend_ms = 3 * IDLE_TIMEOUT_MS;
    let answer = consumer.pull("g", "Park", 0, 1, suspend_ms, None).await;
    assert!(
        started.elapsed() >= Duration::from_millis(suspend_ms - 500),
        "the pull waited its suspend time, it was not cut short"
    );
    assert_eq!(answer.code, response::PULL_NOT_FOUND, "{:?}", answer.remark);
    // Then, with nothing in flight, the connection goes the way of any silent one.
    assert!(consumer.read().await.is_none(), "closed once idle");
    broker.stop().await;
}

#[test]
fn the_timeout_is_never_or_at_least_a_second() {
    let config = |ms| quiver_broker::BrokerConfig {
        idle_connection_timeout_ms: ms,
        ..quiver_broker::BrokerConfig::default()
    };
    assert!(config(0).validate().is_ok());
    assert!(config(120_000).validate().is_ok());
    let error = config(500).validate().unwrap_err().to_string();
    assert!(error.contains("idle-connection-timeout-ms"), "{error}");
}
