//! SEND_MESSAGE_V2 (short header names) and SEND_BATCH_MESSAGE (one request, many messages).

mod common;

use bytes::Bytes;
use common::{pulled_bodies, test_config, v2_send_fields, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::message::{encode_batch, BatchMessage};

fn v2_fields(topic: &str, queue_id: &str, batch: bool) -> quiver_protocol::ExtFields {
    v2_send_fields(topic, queue_id, "0", "WAIT\u{1}true\u{2}", batch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v2_and_batch_sends() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;

    let single = client
        .call(
            request::SEND_MESSAGE_V2,
            v2_fields("Bat", "0", false),
            Bytes::from_static(b"solo"),
        )
        .await;
    assert_eq!(single.code, response::SUCCESS, "{:?}", single.remark);

    let batch: Vec<BatchMessage> = (0..3)
        .map(|i| BatchMessage {
            flag: 0,
            body: Bytes::from(format!("b{i}")),
            properties: format!("TAGS\u{1}T{i}\u{2}KEYS\u{1}k{i}\u{2}"),
        })
        .collect();
    let reply = client
        .call(
            request::SEND_BATCH_MESSAGE,
            v2_fields("Bat", "0", true),
            encode_batch(&batch),
        )
        .await;
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
    assert_eq!(reply.ext("msgId").unwrap().split(',').count(), 3);
    assert_eq!(reply.ext("queueOffset"), Some("1"));

    let pulled = client.pull("G", "Bat", 0, 0, 0, None).await;
    assert_eq!(pulled_bodies(&pulled), vec!["solo", "b0", "b1", "b2"]);
    let records = quiver_store::record::decode_all(&pulled.body).unwrap();
    assert_eq!(records[2].tags(), Some("T1"));

    let garbage = client
        .call(
            request::SEND_BATCH_MESSAGE,
            v2_fields("Bat", "0", true),
            Bytes::from_static(b"\x00\x00\x00\x99junk"),
        )
        .await;
    assert_eq!(garbage.code, response::MESSAGE_ILLEGAL);

    // The batch counts as its three messages, the refused one not at all.
    let metrics = broker.metrics().await;
    let series = |name: &str| format!("{name}{{cluster=\"DefaultCluster\",topic=\"Bat\"}}");
    assert!(
        metrics.contains(&format!("{} 4\n", series("rocketmq_messages_in_total"))),
        "{metrics}"
    );
    // "solo" plus "b0", "b1", "b2".
    assert!(
        metrics.contains(&format!("{} 10\n", series("rocketmq_throughput_in_total"))),
        "{metrics}"
    );
    broker.stop().await;
}
