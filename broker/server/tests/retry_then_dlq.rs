//! CONSUMER_SEND_MSG_BACK: the message comes back from %RETRY%<group> after its delay with
//! reconsumeTimes + 1, and goes to %DLQ%<group> once maxReconsumeTimes is reached.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ext, test_config, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_store::record::decode_all;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_then_dead_letter() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    client.send("Work", 0, "job", "A").await;
    let pulled = client.pull("G", "Work", 0, 0, 0, None).await;
    let record = decode_all(&pulled.body).unwrap().remove(0);
    assert_eq!(record.reconsume_times, 0);

    // delayLevel 1 (1 s), maxReconsumeTimes 1: first send-back retries.
    let send_back = |offset: u64| {
        ext(&[
            ("group", "G"),
            ("offset", &offset.to_string()),
            ("delayLevel", "1"),
            ("maxReconsumeTimes", "1"),
            ("originTopic", "Work"),
        ])
    };
    let reply = client
        .call(
            request::CONSUMER_SEND_MSG_BACK,
            send_back(record.physical_offset.0),
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);

    // Parks on the retry queue; the scheduler re-stores the message when its delay is due.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let retried = loop {
        let reply = client.pull("G", "%RETRY%G", 0, 0, 2_000, None).await;
        if reply.code == response::SUCCESS {
            break decode_all(&reply.body).unwrap().remove(0);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no redelivery: {reply:?}"
        );
    };
    assert_eq!(retried.reconsume_times, 1);
    assert_eq!(&retried.body[..], b"job");
    assert_eq!(retried.tags(), Some("A"));
    assert_eq!(
        quiver_store::record::property(&retried.properties, "RETRY_TOPIC"),
        Some("Work")
    );

    // Second failure: reconsumeTimes 1 >= max 1, so it is dead-lettered at once.
    let reply = client
        .call(
            request::CONSUMER_SEND_MSG_BACK,
            send_back(retried.physical_offset.0),
            Bytes::new(),
        )
        .await;
    assert_eq!(reply.code, response::SUCCESS);
    let dlq = client.pull("G", "%DLQ%G", 0, 0, 0, None).await;
    assert_eq!(dlq.code, response::SUCCESS, "{:?}", dlq.remark);
    let dead = decode_all(&dlq.body).unwrap().remove(0);
    assert_eq!(&dead.body[..], b"job");
    assert_eq!(dead.reconsume_times, 2);
    broker.stop().await;
}
