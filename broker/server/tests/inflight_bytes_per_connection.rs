//! What connections hold while their frames arrive or their requests run is bounded:
//! half-sent frames count what arrived, not what they declared, so many of them never spend
//! the broker-wide budget; a connection at its own budget stops being read while other
//! connections go on, and catches up once its requests are answered.

mod common;

use bytes::Bytes;
use common::{ext, test_config, wait_for, Client, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;
use std::time::Duration;
use tokio::io::AsyncWriteExt;

/// A metric's value as the broker exposes it (0 when absent).
fn metric(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

const INFLIGHT: &str = "quiver_inflight_bytes{cluster=\"DefaultCluster\"}";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_frames_hold_what_arrived_and_others_keep_working() {
    const SENDERS: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        // The smallest broker-wide budget: before, four frames declared at 4 MiB spent it.
        max_inflight_bytes: quiver_protocol::MAX_FRAME_BYTES,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut stalled = Vec::new();
    for _ in 0..SENDERS {
        let mut client = Client::connect(broker.addr).await;
        // A frame declared at 4 MiB, of which 10 bytes are sent.
        let mut start = (4u32 << 20).to_be_bytes().to_vec();
        start.extend_from_slice(b"\0\0\0\x10{\"co");
        client.stream.write_all(&start).await.unwrap();
        stalled.push(client);
    }
    wait_for(
        "the half-sent frames to be read",
        Duration::from_secs(20),
        || async { metric(&broker.metrics().await, INFLIGHT) >= (SENDERS * 10) as f64 },
    )
    .await;

    let mut good = broker.client().await;
    let sent = good.send("Half", 0, "still-served", "A").await;
    assert_eq!(sent.code, response::SUCCESS, "{:?}", sent.remark);
    let pulled = good.pull("G", "Half", 0, 0, 0, None).await;
    assert_eq!(common::pulled_bodies(&pulled), ["still-served"]);

    // Each holds about what it sent and one small read's room, nowhere near 4 MiB.
    let held = metric(&broker.metrics().await, INFLIGHT);
    assert!(
        held <= (SENDERS * 16 * 1024) as f64,
        "{SENDERS} half-sent frames hold {held} bytes of the budget"
    );
    drop(stalled);
    broker.stop().await;
}

/// A long-polling pull padded to about 8 KiB, so a few of them spend a small budget.
fn padded_parking_pull(opaque: i32) -> RemotingCommand {
    let padding = "p".repeat(8 * 1024);
    let fields = ext(&[
        ("consumerGroup", "G"),
        ("topic", "Own"),
        ("queueId", "0"),
        ("queueOffset", "0"),
        ("maxMsgNums", "32"),
        ("sysFlag", "2"),
        ("commitOffset", "-1"),
        ("suspendTimeoutMillis", "15000"),
        ("subscription", "*"),
        ("subVersion", "0"),
        ("padding", &padding),
    ]);
    RemotingCommand::request(request::PULL_MESSAGE, fields)
        .with_opaque(opaque)
        .with_body(Bytes::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_at_its_own_budget_waits_while_others_go_on() {
    const PULLS: i32 = 16;
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        max_inflight_bytes_per_connection: 64 * 1024,
        default_queue_nums: 1,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut admin = broker.client().await;
    assert_eq!(admin.create_topic("Own", 1).await.code, response::SUCCESS);

    // 16 parked pulls of 8 KiB each would hold 128 KiB: the connection's budget is 64 KiB.
    let mut greedy = Client::connect(broker.addr).await;
    for opaque in 1..=PULLS {
        greedy.write(&padded_parking_pull(opaque)).await;
    }
    let waits = "quiver_read_waits_total{cluster=\"DefaultCluster\",budget=\"connection\"}";
    wait_for(
        "the greedy connection to wait for its own budget",
        Duration::from_secs(20),
        || async { metric(&broker.metrics().await, waits) >= 1.0 },
    )
    .await;
    let parked = metric(
        &broker.metrics().await,
        "quiver_parked_pulls{cluster=\"DefaultCluster\"}",
    );
    assert!(
        (1.0..f64::from(PULLS)).contains(&parked),
        "some pulls parked, the rest unread: {parked}"
    );

    // Another connection is read and served meanwhile; its message wakes the parked pulls.
    let sent = admin.send("Own", 0, "wake", "A").await;
    assert_eq!(sent.code, response::SUCCESS, "{:?}", sent.remark);
    // Once answered, their bytes come back and the rest of the pulls are read and answered.
    let mut answered = Vec::new();
    while answered.len() < PULLS as usize {
        let answer = greedy.read().await.expect("every pull is answered");
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
        answered.push(answer.opaque);
    }
    answered.sort_unstable();
    assert_eq!(answered, (1..=PULLS).collect::<Vec<_>>());
    broker.stop().await;
}
