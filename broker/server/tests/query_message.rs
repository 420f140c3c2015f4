//! QUERY_MESSAGE (12) by key and by unique key, VIEW_MESSAGE_BY_ID (33) with the offset message
//! id a send returned, GET_EARLIEST_MSG_STORETIME (32), as stock clients send them; the index
//! survives a restart.

mod common;

use bytes::Bytes;
use common::{ext, ext_u64, test_config, v2_send_fields, Client, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::message::decode_offset_msg_id;
use quiver_protocol::{ExtFields, RemotingCommand};

const TOPIC: &str = "Queried";

async fn send(client: &mut Client, body: &str, unique_key: &str, keys: &str) -> String {
    let props = format!("UNIQ_KEY\u{1}{unique_key}\u{2}KEYS\u{1}{keys}\u{2}WAIT\u{1}true\u{2}");
    let fields = v2_send_fields(TOPIC, "1", "0", &props, false);
    let sent = client
        .call(
            request::SEND_MESSAGE_V2,
            fields,
            Bytes::from(body.to_owned()),
        )
        .await;
    assert_eq!(sent.code, response::SUCCESS, "{:?}", sent.remark);
    sent.ext("msgId").expect("msgId").to_owned()
}

fn query_fields(key: &str, max_num: i32, begin: i64, end: i64) -> ExtFields {
    ext(&[
        ("topic", TOPIC),
        ("key", key),
        ("maxNum", &max_num.to_string()),
        ("beginTimestamp", &begin.to_string()),
        ("endTimestamp", &end.to_string()),
    ])
}

async fn query(client: &mut Client, fields: ExtFields) -> RemotingCommand {
    client
        .call(request::QUERY_MESSAGE, fields, Bytes::new())
        .await
}

fn bodies(reply: &RemotingCommand) -> Vec<String> {
    common::pulled_bodies(reply)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_are_found_by_key_unique_key_and_offset_id_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let created = client.create_topic(TOPIC, 4).await;
    assert_eq!(created.code, response::SUCCESS);
    let before = quiver_broker::now_ms();
    let mut ids = Vec::new();
    for i in 0..5 {
        let keys = format!("order-{} all", i % 2);
        ids.push(send(&mut client, &format!("b{i}"), &format!("U{i}"), &keys).await);
    }

    let by_key = query(&mut client, query_fields("order-1", 32, 0, i64::MAX)).await;
    assert_eq!(by_key.code, response::SUCCESS, "{:?}", by_key.remark);
    assert_eq!(bodies(&by_key), ["b1", "b3"]);
    assert!(ext_u64(&by_key, "indexLastUpdateTimestamp") >= before as u64);
    assert!(ext_u64(&by_key, "indexLastUpdatePhyoffset") > 0);
    let newest = query(&mut client, query_fields("all", 2, 0, i64::MAX)).await;
    assert_eq!(bodies(&newest), ["b3", "b4"], "maxNum keeps the newest");

    let mut unique = query_fields("U3", 1, 0, i64::MAX);
    unique.insert("_UNIQUE_KEY_QUERY", "true");
    let by_unique_key = query(&mut client, unique).await;
    assert_eq!(by_unique_key.code, response::SUCCESS);
    assert_eq!(bodies(&by_unique_key), ["b3"]);

    let missing = query(&mut client, query_fields("order-7", 32, 0, i64::MAX)).await;
    assert_eq!(missing.code, response::QUERY_NOT_FOUND);
    assert!(missing
        .remark
        .unwrap_or_default()
        .contains("can not find message"));
    let too_early = query(&mut client, query_fields("order-1", 32, 0, before - 1)).await;
    assert_eq!(too_early.code, response::QUERY_NOT_FOUND);

    // The send's msgId names this broker and the record's CommitLog offset.
    let (host, offset) = decode_offset_msg_id(&ids[2]).unwrap();
    assert_eq!(host, broker.addr);
    let view = |offset: u64| ext(&[("offset", &offset.to_string())]);
    let viewed = client
        .call(request::VIEW_MESSAGE_BY_ID, view(offset), Bytes::new())
        .await;
    assert_eq!(viewed.code, response::SUCCESS, "{:?}", viewed.remark);
    let records = quiver_store::record::decode_all(&viewed.body).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].body.as_ref(), b"b2");
    assert_eq!(
        records[0]
            .properties_map()
            .get("UNIQ_KEY")
            .map(String::as_str),
        Some("U2")
    );
    let inside = client
        .call(request::VIEW_MESSAGE_BY_ID, view(offset + 1), Bytes::new())
        .await;
    assert_eq!(inside.code, response::SYSTEM_ERROR);
    assert!(inside.remark.unwrap_or_default().starts_with(&format!(
        "can not find message by the offset, {}",
        offset + 1
    )));

    let earliest = |queue: &'static str| ext(&[("topic", TOPIC), ("queueId", queue)]);
    let stored = client
        .call(
            request::GET_EARLIEST_MSG_STORETIME,
            earliest("1"),
            Bytes::new(),
        )
        .await;
    assert_eq!(stored.code, response::SUCCESS);
    assert!(ext_u64(&stored, "timestamp") >= before as u64);
    let empty = client
        .call(
            request::GET_EARLIEST_MSG_STORETIME,
            earliest("3"),
            Bytes::new(),
        )
        .await;
    assert_eq!(empty.ext("timestamp"), Some("-1"));

    broker.stop().await;
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let after_restart = query(&mut client, query_fields("order-1", 32, 0, i64::MAX)).await;
    assert_eq!(bodies(&after_restart), ["b1", "b3"]);
    broker.stop().await;
}
