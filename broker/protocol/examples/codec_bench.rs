//! Prints codec throughput: frame encode/decode of a 1 KiB send (JSON and binary headers),
//! a C++-style heartbeat body decode, and batch encode/decode.
//!
//! Run: `cargo run --release -p quiver-protocol --example codec_bench`

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quiver_protocol::body::HeartbeatData;
use quiver_protocol::code::request;
use quiver_protocol::header::{SendMessageRequestHeader, SendMessageResponseHeader};
use quiver_protocol::message::{decode_batch_shared, encode_batch, BatchMessage};
use quiver_protocol::{frame, RemotingCommand, SerializeType};

/// Runs `work` repeatedly for about `budget` and returns operations per second.
fn measure(budget: Duration, mut work: impl FnMut()) -> f64 {
    let started = Instant::now();
    let mut operations = 0u64;
    while started.elapsed() < budget {
        for _ in 0..256 {
            work();
        }
        operations += 256;
    }
    operations as f64 / started.elapsed().as_secs_f64()
}

fn report(name: &str, ops_per_sec: f64, bytes_per_op: usize) {
    let mib_per_sec = ops_per_sec * bytes_per_op as f64 / (1024.0 * 1024.0);
    println!("{name:<44} {ops_per_sec:>12.0} ops/s {mib_per_sec:>9.1} MiB/s");
}

fn send_header() -> SendMessageRequestHeader {
    SendMessageRequestHeader {
        producer_group: "bench-producer".into(),
        topic: "BenchTopic".into(),
        default_topic: "TBW102".into(),
        default_topic_queue_nums: 4,
        queue_id: 1,
        sys_flag: 0,
        born_timestamp: 1_700_000_000_000,
        flag: 0,
        properties: Some("TAGS\u{1}TagA\u{2}KEYS\u{1}order-1\u{2}WAIT\u{1}true\u{2}".into()),
        reconsume_times: Some(0),
        unit_mode: Some(false),
        batch: Some(false),
        max_reconsume_times: None,
    }
}

fn send_command(serialize_type: SerializeType) -> RemotingCommand {
    RemotingCommand::request(request::SEND_MESSAGE_V2, send_header().to_v2_ext())
        .with_opaque(1)
        .with_body(Bytes::from(vec![b'x'; 1024]))
        .with_serialize_type(serialize_type)
}

fn main() {
    let budget = Duration::from_millis(700);
    println!(
        "codec throughput (one thread, {} ms per case)",
        budget.as_millis()
    );
    frames(budget);
    single_send_overhead(budget);
    bodies(budget);
}

/// A 1 KiB SEND_MESSAGE_V2 frame encoded and decoded, with each header serialisation.
fn frames(budget: Duration) {
    for (label, serialize_type) in [
        ("JSON", SerializeType::Json),
        ("binary", SerializeType::RocketMq),
    ] {
        let command = send_command(serialize_type);
        let encoded = frame::encode_to_bytes(&command).expect("encodable");
        let mut out = BytesMut::with_capacity(4096);
        let encode = measure(budget, || {
            out.clear();
            frame::encode(black_box(&command), &mut out).expect("encodable");
        });
        report(
            &format!("encode 1 KiB SEND_MESSAGE_V2, {label} header"),
            encode,
            encoded.len(),
        );
        let decode = measure(budget, || {
            let mut buf = BytesMut::from(&encoded[..]);
            let decoded = frame::decode(&mut buf).expect("valid").expect("whole");
            black_box(SendMessageRequestHeader::from_request(&decoded).expect("typed"));
        });
        report(
            &format!("decode 1 KiB SEND_MESSAGE_V2, {label} header"),
            decode,
            encoded.len(),
        );
    }
}

/// What one single send costs each side beyond the body: the header's extFields built and
/// framed, then read back into the typed header (binary headers, as the clients send).
fn single_send_overhead(budget: Duration) {
    let header = send_header();
    let body = Bytes::from(vec![b'x'; 1024]);
    let mut out = BytesMut::with_capacity(4096);
    let client_send = measure(budget, || {
        out.clear();
        let command =
            RemotingCommand::request(request::SEND_MESSAGE_V2, black_box(&header).to_v2_ext())
                .with_opaque(1)
                .with_body(body.clone())
                .with_serialize_type(SerializeType::RocketMq);
        frame::encode(&command, &mut out).expect("encodable");
    });
    report(
        "client: build + encode SEND_MESSAGE_V2",
        client_send,
        out.len(),
    );
    let request = send_command(SerializeType::RocketMq);
    let answer_header = SendMessageResponseHeader {
        msg_id: "7F00000100002A9F0000000000A3C5E0".into(),
        queue_id: 1,
        queue_offset: 123_456,
        transaction_id: None,
    };
    let broker_answer = measure(budget, || {
        out.clear();
        let answer = request
            .response_to(0, None)
            .with_ext_fields(black_box(&answer_header).to_ext());
        frame::encode(&answer, &mut out).expect("encodable");
    });
    report(
        "broker: build + encode the send's answer",
        broker_answer,
        out.len(),
    );
    let answer = frame::encode_to_bytes(
        &request
            .response_to(0, None)
            .with_ext_fields(answer_header.to_ext()),
    )
    .expect("encodable");
    let client_read = measure(budget, || {
        let mut buf = BytesMut::from(&answer[..]);
        let decoded = frame::decode(&mut buf).expect("valid").expect("whole");
        black_box(SendMessageResponseHeader::from_command(&decoded).expect("typed"));
    });
    report(
        "client: decode + read the send's answer",
        client_read,
        answer.len(),
    );
}

/// A heartbeat body and a batch of 32 messages, decoded and encoded.
fn bodies(budget: Duration) {
    let heartbeat = br#"{"clientID":"13246-127.0.0.1@DEFAULT","consumerDataSet":[{"consumeFromWhere":0,"consumeType":1,"groupName":"GroupCapture","messageModel":1,"subscriptionDataSet":[{"subString":"*","subVersion":"1795952784668","topic":"%RETRY%GroupCapture"},{"codeSet":[0,0],"subString":"TagA || TagB","subVersion":"1795952784668","tagsSet":["TagA","TagB"],"topic":"TopicTest"}]}],"producerDataSet":[{"groupName":"GroupCaptureProducer"}]}"#;
    let decode = measure(budget, || {
        black_box(HeartbeatData::decode(black_box(heartbeat)).expect("valid"));
    });
    report("decode C++ heartbeat body", decode, heartbeat.len());

    let batch: Vec<BatchMessage> = (0..32)
        .map(|index| BatchMessage {
            flag: 0,
            body: Bytes::from(vec![b'y'; 1024]),
            properties: format!("TAGS\u{1}TagA\u{2}KEYS\u{1}k{index}\u{2}"),
        })
        .collect();
    let encoded = encode_batch(&batch);
    let encode = measure(budget, || {
        black_box(encode_batch(black_box(&batch)));
    });
    report("encode batch of 32 x 1 KiB", encode, encoded.len());
    let decode = measure(budget, || {
        black_box(decode_batch_shared(black_box(&encoded)).expect("valid"));
    });
    report(
        "decode batch of 32 x 1 KiB (zero-copy bodies)",
        decode,
        encoded.len(),
    );
}
