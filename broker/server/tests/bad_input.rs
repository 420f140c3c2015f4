//! Bad input gets a clear answer (or, for framing errors, a closed connection), and neither
//! other connections nor stored data are affected.

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::{ext, pulled_bodies, test_config, Client, TestBroker};
use quiver_protocol::code::{request, response};
use tokio::io::AsyncWriteExt;

/// Writes raw bytes and expects the broker to close the connection without answering.
async fn expect_closed(broker: &TestBroker, raw: &[u8]) {
    let mut client = broker.client().await;
    client.stream.write_all(raw).await.unwrap();
    assert!(client.read().await.is_none(), "connection should be closed");
}

fn json_frame(header: &[u8]) -> Vec<u8> {
    let mut raw = BytesMut::new();
    raw.put_i32(4 + header.len() as i32);
    raw.put_i32(header.len() as i32);
    raw.put_slice(header);
    raw.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut keeper = broker.client().await;
    assert_eq!(
        keeper.send("Safe", 0, "before", "A").await.code,
        response::SUCCESS
    );

    // Framing errors close the connection.
    let mut oversized = BytesMut::new();
    oversized.put_i32(17 * 1024 * 1024);
    oversized.put_i32(10);
    expect_closed(&broker, &oversized).await;
    let mut header_past_frame = BytesMut::new();
    header_past_frame.put_i32(8);
    header_past_frame.put_i32(100);
    header_past_frame.put_slice(b"{}{}");
    expect_closed(&broker, &header_past_frame).await;
    expect_closed(&broker, &json_frame(b"{\"code\": 10, not json")).await;

    // Request errors are answered with a code and a remark.
    let mut client = broker.client().await;
    let missing = client
        .call(
            request::SEND_MESSAGE,
            ext(&[("producerGroup", "P"), ("queueId", "0")]),
            Bytes::from_static(b"x"),
        )
        .await;
    assert_eq!(missing.code, response::SYSTEM_ERROR);
    assert!(
        missing.remark.as_deref().unwrap().contains("topic"),
        "{missing:?}"
    );

    let bad_topic = client.send("bad topic!", 0, "x", "A").await;
    assert_eq!(bad_topic.code, response::MESSAGE_ILLEGAL);
    assert!(bad_topic.remark.as_deref().unwrap().contains("bad topic!"));
    let long_topic = client.send(&"t".repeat(128), 0, "x", "A").await;
    assert_eq!(long_topic.code, response::MESSAGE_ILLEGAL);
    // The internal state log's records would change consumer-group state.
    let state_log = client.send("rmq_sys_quiver_state", 0, "x", "A").await;
    assert_eq!(state_log.code, response::MESSAGE_ILLEGAL);
    assert!(state_log
        .remark
        .as_deref()
        .unwrap()
        .contains("internal state log"));

    let huge = "x".repeat(300 * 1024);
    let too_big = client.send("Safe", 0, &huge, "A").await;
    assert_eq!(too_big.code, response::MESSAGE_ILLEGAL);
    assert!(too_big
        .remark
        .as_deref()
        .unwrap()
        .contains("max-message-size"));

    let bad_heartbeat = client
        .call(
            request::HEART_BEAT,
            Default::default(),
            Bytes::from_static(b"{nope"),
        )
        .await;
    assert_eq!(bad_heartbeat.code, response::SYSTEM_ERROR);
    let remark = bad_heartbeat.remark.unwrap_or_default();
    assert!(remark.contains("heartbeat body is invalid"), "{remark}");

    let unknown = client.call(9_999, Default::default(), Bytes::new()).await;
    assert_eq!(unknown.code, response::REQUEST_CODE_NOT_SUPPORTED);
    assert!(unknown.remark.as_deref().unwrap().contains("9999"));

    let bad_offset = client
        .call(
            request::QUERY_CONSUMER_OFFSET,
            ext(&[
                ("consumerGroup", "G"),
                ("topic", "Safe"),
                ("queueId", "minus-one"),
            ]),
            Bytes::new(),
        )
        .await;
    assert_eq!(bad_offset.code, response::SYSTEM_ERROR);
    assert!(bad_offset.remark.as_deref().unwrap().contains("queueId"));

    // Random garbage on fresh connections: the broker survives all of it.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for round in 0..40 {
        let mut garbage = vec![0u8; 8 + (round * 37) % 300];
        for byte in garbage.iter_mut() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            *byte = seed as u8;
        }
        let mut client = Client::connect(broker.addr).await;
        let _ = client.stream.write_all(&garbage).await;
        let _ = client.stream.shutdown().await;
    }

    // The first connection still works and the stored message is intact.
    assert_eq!(
        keeper.send("Safe", 0, "after", "A").await.code,
        response::SUCCESS
    );
    let pulled = keeper.pull("G", "Safe", 0, 0, 0, None).await;
    assert_eq!(pulled_bodies(&pulled), vec!["before", "after"]);
    broker.stop().await;
}
