//! What a stock client can ask for and Quiver does not implement is refused with a clear
//! code and remark, never stored as a plain message or served wrongly; and answers look like
//! an Apache broker's.

mod common;

use bytes::Bytes;
use common::{ext, test_config, v2_send_fields, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::message::{encode_batch, BatchMessage};

fn send_fields(
    topic: &str,
    sys_flag: &str,
    properties: &str,
    batch: bool,
) -> quiver_protocol::ExtFields {
    v2_send_fields(topic, "0", sys_flag, properties, batch)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_timers_batch_delays_and_unknown_filters_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    let send = |sys_flag: &'static str, properties: &'static str| {
        (
            send_fields("Unsup", sys_flag, properties, false),
            Bytes::from_static(b"body"),
        )
    };

    // Timers are served (tests/timers.rs); a malformed one or one beyond
    // timer-max-delay-ms is refused, and so is a timer inside a batch.
    let cases = [
        (
            send("0", "TIMER_DELIVER_MS\u{1}1900000000000\u{2}"),
            response::MESSAGE_ILLEGAL,
            "timer-max-delay-ms",
        ),
        (
            send("0", "TIMER_DELAY_SEC\u{1}thirty\u{2}"),
            response::MESSAGE_ILLEGAL,
            "TIMER_DELAY_SEC",
        ),
        (
            send("0", "TIMER_DELAY_MS\u{1}1.5\u{2}"),
            response::MESSAGE_ILLEGAL,
            "TIMER_DELAY_MS",
        ),
    ];
    for ((fields, body), code, named) in cases {
        let reply = client.call(request::SEND_MESSAGE_V2, fields, body).await;
        assert_eq!(reply.code, code, "{reply:?}");
        let remark = reply.remark.unwrap_or_default();
        assert!(
            remark.contains(named) && remark.contains("not stored"),
            "{remark}"
        );
    }

    let batch = [
        BatchMessage {
            flag: 0,
            body: Bytes::from_static(b"b0"),
            properties: String::new(),
        },
        BatchMessage {
            flag: 0,
            body: Bytes::from_static(b"b1"),
            properties: "DELAY\u{1}3\u{2}".into(),
        },
    ];
    let reply = client
        .call(
            request::SEND_BATCH_MESSAGE,
            send_fields("Unsup", "0", "", true),
            encode_batch(&batch),
        )
        .await;
    assert_eq!(reply.code, response::MESSAGE_ILLEGAL, "{reply:?}");
    assert!(reply.remark.unwrap_or_default().contains("delay level"));
    let timed = [BatchMessage {
        flag: 0,
        body: Bytes::from_static(b"t0"),
        properties: "TIMER_DELAY_MS\u{1}500\u{2}".into(),
    }];
    let reply = client
        .call(
            request::SEND_BATCH_MESSAGE,
            send_fields("Unsup", "0", "", true),
            encode_batch(&timed),
        )
        .await;
    assert_eq!(reply.code, response::MESSAGE_ILLEGAL, "{reply:?}");
    let remark = reply.remark.unwrap_or_default();
    assert!(
        remark.contains("TIMER_DELAY_MS") && remark.contains("not stored"),
        "{remark}"
    );

    // Nothing above was stored.
    let max = client
        .call(
            request::GET_MAX_OFFSET,
            ext(&[("topic", "Unsup"), ("queueId", "0")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(max.ext("offset"), Some("0"), "{max:?}");

    // A plain send works, and the answer speaks as an Apache broker does.
    let (fields, body) = send("0", "");
    let sent = client.call(request::SEND_MESSAGE_V2, fields, body).await;
    assert_eq!(sent.code, response::SUCCESS, "{sent:?}");
    assert_eq!(sent.language, "JAVA");

    // An expression type other than TAG or SQL92 is refused on pull, never matched as if it
    // were a tag.
    let mut fields = ext(&[
        ("consumerGroup", "SqlGroup"),
        ("topic", "Unsup"),
        ("queueId", "0"),
        ("queueOffset", "0"),
        ("maxMsgNums", "32"),
        // The subscription travels with the pull (FLAG_SUBSCRIPTION).
        ("sysFlag", "4"),
        ("commitOffset", "-1"),
        ("suspendTimeoutMillis", "0"),
        ("subscription", "//a"),
        ("subVersion", "0"),
    ]);
    fields.insert("expressionType", "XPATH");
    let pulled = client
        .call(request::PULL_MESSAGE, fields, Bytes::new())
        .await;
    assert_eq!(pulled.code, response::SYSTEM_ERROR, "{pulled:?}");
    assert!(pulled.remark.unwrap_or_default().contains("XPATH"));
    let offset = client.query_offset("SqlGroup", "Unsup", 0).await;
    assert_eq!(
        offset.code,
        response::QUERY_NOT_FOUND,
        "the group's offset did not move: {offset:?}"
    );
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_batch_and_a_transactional_batch_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    // Half messages are sent one by one (each has its own outcome), as Apache's clients do.
    let half = [BatchMessage {
        flag: 0,
        body: Bytes::from_static(b"h0"),
        properties: "TRAN_MSG\u{1}true\u{2}PGROUP\u{1}P\u{2}".into(),
    }];
    let reply = client
        .call(
            request::SEND_BATCH_MESSAGE,
            send_fields("Unsup", "4", "", true),
            encode_batch(&half),
        )
        .await;
    assert_eq!(reply.code, response::MESSAGE_ILLEGAL, "{reply:?}");
    let remark = reply.remark.unwrap_or_default();
    assert!(
        remark.contains("transactional") && remark.contains("not stored"),
        "{remark}"
    );

    // A delay level on the batch itself, as Apache's CommitLog refuses it.
    let batch = [BatchMessage {
        flag: 0,
        body: Bytes::from_static(b"b0"),
        properties: String::new(),
    }];
    let reply = client
        .call(
            request::SEND_BATCH_MESSAGE,
            send_fields("Unsup", "0", "DELAY\u{1}2\u{2}", true),
            encode_batch(&batch),
        )
        .await;
    assert_eq!(reply.code, response::MESSAGE_ILLEGAL, "{reply:?}");
    assert!(reply.remark.unwrap_or_default().contains("not stored"));
    let max = client
        .call(
            request::GET_MAX_OFFSET,
            ext(&[("topic", "Unsup"), ("queueId", "0")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(max.ext("offset"), Some("0"), "{max:?}");
    broker.stop().await;
}
