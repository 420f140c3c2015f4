//! A client that starts a frame and stalls is disconnected after frame-read-timeout-ms and
//! counted; meanwhile another client keeps producing and consuming, and a client that sends
//! whole frames slower than the timeout apart is never cut off.

mod common;

use std::time::{Duration, Instant};

use common::{pulled_bodies, test_config, Client, TestBroker};
use quiver_protocol::code::response;
use tokio::io::AsyncWriteExt;

const FRAME_TIMEOUT_MS: u64 = 500;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_frame_closes_its_connection_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        frame_read_timeout_ms: FRAME_TIMEOUT_MS,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut well_behaved = broker.client().await;
    let mut stalled = Client::connect(broker.addr).await;
    // A frame that declares 4 MiB and brings 10 bytes of it.
    let mut start = (4u32 * 1024 * 1024).to_be_bytes().to_vec();
    start.extend_from_slice(&[0, 0, 0, 100, b'{', b'"']);
    stalled.stream.write_all(&start).await.unwrap();
    let started = Instant::now();

    // Whole frames slower than the timeout apart are fine: only a started frame is timed.
    let mut sent = 0u64;
    while started.elapsed() < Duration::from_millis(3 * FRAME_TIMEOUT_MS) {
        let answer = well_behaved.send("Slow", 0, &format!("m{sent}"), "A").await;
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(FRAME_TIMEOUT_MS + 100)).await;
    }
    assert!(
        stalled.read().await.is_none(),
        "the stalled sender was closed"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(FRAME_TIMEOUT_MS),
        "not before its timeout"
    );
    let pulled = well_behaved.pull("G", "Slow", 0, 0, 0, None).await;
    assert_eq!(pulled.code, response::SUCCESS);
    assert_eq!(
        pulled_bodies(&pulled).len() as u64,
        sent,
        "every send was stored"
    );
    let metrics = broker.metrics().await;
    assert_eq!(
        common::connections_closed(&metrics, "frame-read-timeout"),
        1,
        "{metrics}"
    );
    broker.stop().await;
}

#[test]
fn the_timeout_is_off_or_at_least_100_ms() {
    let config = |ms| quiver_broker::BrokerConfig {
        frame_read_timeout_ms: ms,
        ..quiver_broker::BrokerConfig::default()
    };
    assert!(config(0).validate().is_ok());
    assert!(config(30_000).validate().is_ok());
    let error = config(50).validate().unwrap_err().to_string();
    assert!(error.contains("frame-read-timeout-ms"), "{error}");
}
