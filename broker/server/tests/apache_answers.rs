//! Answers shaped as an Apache broker's: the response headers field for field (JSON and
//! binary; a send answered in the kind it was asked in), QUERY_CONSUMER_OFFSET for a group with no offset (14), GET_CONSUME_STATS (208).

mod common;

use bytes::{Buf, Bytes, BytesMut};
use common::{ext, test_config, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::{frame, RemotingCommand, SerializeType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The keys of Apache's `RemotingCommand` as fastjson writes them (alphabetical; `remark`
/// only when there is one).
const APACHE_JSON_KEYS: [&str; 8] = [
    "code",
    "extFields",
    "flag",
    "language",
    "opaque",
    "remark",
    "serializeTypeCurrentRPC",
    "version",
];

/// Sends one request and returns the raw response frame after its length prefix:
/// (serialize type byte, header bytes).
async fn raw_exchange(stream: &mut TcpStream, request: &RemotingCommand) -> (u8, Bytes) {
    let mut out = BytesMut::new();
    frame::encode(request, &mut out).unwrap();
    stream.write_all(&out).await.unwrap();
    let total = stream.read_i32().await.unwrap() as usize;
    let mut frame = vec![0u8; total];
    stream.read_exact(&mut frame).await.unwrap();
    let mut frame = Bytes::from(frame);
    let word = frame.get_u32();
    let header_len = (word & 0x00FF_FFFF) as usize;
    ((word >> 24) as u8, frame.split_to(header_len))
}

fn json_keys(header: &[u8]) -> (Vec<String>, serde_json::Value) {
    // Read in document order: fastjson writes the keys sorted.
    let text = std::str::from_utf8(header).unwrap();
    let value: serde_json::Value = serde_json::from_str(text).unwrap();
    let mut keys: Vec<(usize, String)> = value
        .as_object()
        .unwrap()
        .keys()
        .map(|key| (text.find(&format!("\"{key}\":")).unwrap(), key.clone()))
        .collect();
    keys.sort();
    (keys.into_iter().map(|(_, key)| key).collect(), value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_headers_carry_apaches_fields_json_and_binary() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    let max_offset = |serialize_type| {
        RemotingCommand::request(
            request::GET_MAX_OFFSET,
            ext(&[("topic", "Hdr"), ("queueId", "0")]),
        )
        .with_opaque(41)
        .with_serialize_type(serialize_type)
    };

    // JSON: a success (no remark) and a refusal (with one).
    let (kind, header) = raw_exchange(&mut stream, &max_offset(SerializeType::Json)).await;
    assert_eq!(kind, 0);
    let (keys, value) = json_keys(&header);
    let without_remark: Vec<&str> = APACHE_JSON_KEYS
        .into_iter()
        .filter(|k| *k != "remark")
        .collect();
    assert_eq!(keys, without_remark, "{value}");
    assert_eq!(value["code"], 0);
    assert_eq!(value["language"], "JAVA");
    assert_eq!(value["serializeTypeCurrentRPC"], "JSON");
    assert_eq!(value["flag"], 1);
    assert_eq!(value["opaque"], 41);
    assert_eq!(value["version"], quiver_protocol::PROTOCOL_VERSION);
    assert_eq!(value["extFields"]["offset"], "0");
    let refused = RemotingCommand::request(9999, Default::default()).with_opaque(42);
    let (_, header) = raw_exchange(&mut stream, &refused).await;
    let (keys, value) = json_keys(&header);
    assert_eq!(keys, APACHE_JSON_KEYS, "{value}");
    assert_eq!(value["code"], response::REQUEST_CODE_NOT_SUPPORTED);
    assert!(value["remark"].as_str().unwrap().contains("9999"));

    // Binary (RocketMQSerializable): code, language JAVA (0), version, opaque, flag, remark,
    // extFields.
    let (kind, header) = raw_exchange(&mut stream, &max_offset(SerializeType::RocketMq)).await;
    assert_eq!(kind, 1);
    let mut header = header;
    assert_eq!(header.get_i16(), 0, "code");
    assert_eq!(header.get_u8(), 0, "language JAVA");
    assert_eq!(
        i32::from(header.get_i16()),
        quiver_protocol::PROTOCOL_VERSION
    );
    assert_eq!(header.get_i32(), 41, "opaque");
    assert_eq!(header.get_i32(), 1, "flag: response");
    assert_eq!(header.get_i32(), 0, "no remark");
    let ext_len = header.get_i32() as usize;
    assert_eq!(ext_len, header.remaining());
    assert_eq!(header.get_i16(), 6);
    assert_eq!(&header.split_to(6)[..], b"offset");
    assert_eq!(header.get_i32(), 1);
    assert_eq!(&header[..], b"0");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_reads_a_young_queue_from_zero_as_apache_answers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    for i in 0..3 {
        assert_eq!(client.send("Young", 0, &format!("m{i}"), "A").await.code, 0);
    }
    // A 4.x client asks without setZeroIfNotFound: offset 0 is still in memory, so 0.
    let plain = client.query_offset_with("NewGroup", "Young", 0, &[]).await;
    assert_eq!(plain.code, response::SUCCESS, "{plain:?}");
    assert_eq!(plain.ext("offset"), Some("0"));
    // An empty queue, and a topic never written, answer 0 too.
    let empty = client.query_offset_with("NewGroup", "Young", 3, &[]).await;
    assert_eq!(empty.ext("offset"), Some("0"), "{empty:?}");
    let unknown = client
        .query_offset_with("NewGroup", "Nowhere", 0, &[])
        .await;
    assert_eq!(unknown.ext("offset"), Some("0"), "{unknown:?}");
    // setZeroIfNotFound=false (5.x clients, Quiver's): nothing committed is QUERY_NOT_FOUND.
    let strict = client.query_offset("NewGroup", "Young", 0).await;
    assert_eq!(strict.code, response::QUERY_NOT_FOUND, "{strict:?}");
    assert!(strict.remark.unwrap().contains("Not found"));
    // A committed offset wins either way, and nothing was committed by the queries.
    client.pull("NewGroup", "Young", 0, 2, 0, Some(2)).await;
    let committed = client.query_offset_with("NewGroup", "Young", 0, &[]).await;
    assert_eq!(committed.ext("offset"), Some("2"));
    let untouched = client.query_offset("NewGroup", "Young", 3).await;
    assert_eq!(untouched.code, response::QUERY_NOT_FOUND);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_stats_report_zero_for_uncommitted_queues_unless_asked_to_mark_them() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let created = client.create_topic("Stats", 2).await;
    assert_eq!(created.code, 0);
    client.send("Stats", 0, "a", "A").await;
    client.send("Stats", 1, "b", "A").await;
    client.pull("SG", "Stats", 0, 1, 0, Some(1)).await;
    let stats = |mark: Option<&'static str>| {
        let mut fields = ext(&[("consumerGroup", "SG"), ("topic", "Stats")]);
        if let Some(mark) = mark {
            fields.insert("markUncommitted", mark);
        }
        fields
    };
    let offsets = |reply: &RemotingCommand| {
        let stats = quiver_protocol::body::ConsumeStats::decode(&reply.body).unwrap();
        stats
            .offset_table
            .iter()
            .map(|(queue, wrapper)| (queue.queue_id, wrapper.consumer_offset))
            .collect::<Vec<_>>()
    };
    let apache = client
        .call(request::GET_CONSUME_STATS, stats(None), Bytes::new())
        .await;
    assert_eq!(apache.code, 0, "{apache:?}");
    assert_eq!(offsets(&apache), [(0, 1), (1, 0)]);
    let marked = client
        .call(
            request::GET_CONSUME_STATS,
            stats(Some("true")),
            Bytes::new(),
        )
        .await;
    assert_eq!(offsets(&marked), [(0, 1), (1, -1)]);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_with_a_binary_header_is_answered_in_kind_and_a_json_one_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    broker.client().await.create_topic("BinSend", 1).await;
    let mut stream = TcpStream::connect(broker.addr).await.unwrap();
    for (opaque, serialize_type, kind) in [
        (51, SerializeType::RocketMq, 1),
        (52, SerializeType::Json, 0),
        (53, SerializeType::RocketMq, 1),
    ] {
        let fields = common::v2_send_fields("BinSend", "0", "0", "", false);
        let send = RemotingCommand::request(request::SEND_MESSAGE_V2, fields)
            .with_opaque(opaque)
            .with_serialize_type(serialize_type)
            .with_body(Bytes::from_static(b"hello"));
        let (answered_kind, header) = raw_exchange(&mut stream, &send).await;
        assert_eq!(answered_kind, kind, "opaque {opaque}");
        // Decoded by the protocol crate's codec as the kind it names.
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&((4 + header.len()) as i32).to_be_bytes());
        frame.extend_from_slice(&(u32::from(kind) << 24 | header.len() as u32).to_be_bytes());
        frame.extend_from_slice(&header);
        let answer = frame::decode(&mut frame).unwrap().expect("a whole frame");
        assert_eq!(answer.serialize_type, serialize_type);
        assert_eq!(answer.opaque, opaque);
        assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
    }
    broker.stop().await;
}
