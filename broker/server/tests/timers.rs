//! Timed delivery (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS): a timed message
//! reaches its real queue not before its time, with its properties, keys and unique key; a
//! time already passed is delivered at once; beyond the maximum is refused; a committed half
//! message is timed from the commit; many timers fire once each, none early.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::{end_fields, ext, pulled_records, send_half, test_config, v2_send_fields, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::message::sys_flag::TRANSACTION_COMMIT;
use quiver_store::record::{property, Record};

/// Sends one message with `properties` to `topic` queue `queue`; the answer.
async fn send(
    client: &mut common::Client,
    topic: &str,
    queue: u32,
    body: &str,
    properties: &str,
) -> quiver_protocol::RemotingCommand {
    client
        .call(
            request::SEND_MESSAGE_V2,
            v2_send_fields(topic, &queue.to_string(), "0", properties, false),
            Bytes::from(body.to_string()),
        )
        .await
}

/// Every record in `topic` queue `queue` from offset 0 on.
async fn records(client: &mut common::Client, topic: &str, queue: u32) -> Vec<Record> {
    let mut all = Vec::new();
    loop {
        let pulled = client
            .pull("G", topic, queue, all.len() as u64, 0, None)
            .await;
        if pulled.code != response::SUCCESS {
            return all;
        }
        let got = pulled_records(&pulled);
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

/// Waits (up to `limit`) until `topic` queue `queue` holds `count` records; returns them.
async fn wait_records(
    client: &mut common::Client,
    topic: &str,
    queue: u32,
    count: usize,
    limit: Duration,
) -> Vec<Record> {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let found = records(client, topic, queue).await;
        if found.len() >= count {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} of {count} timed messages arrived in {topic}:{queue}",
            found.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_messages_arrive_not_before_their_time_with_their_properties() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    client.create_topic("Timed", 4).await;
    let sent_at = quiver_broker::now_ms();
    let cases = [
        (
            "at",
            format!("TIMER_DELIVER_MS\u{1}{}\u{2}", sent_at + 1_500),
        ),
        ("sec", "TIMER_DELAY_SEC\u{1}1\u{2}".to_owned()),
        ("ms", "TIMER_DELAY_MS\u{1}1200\u{2}".to_owned()),
    ];
    for (body, timer) in &cases {
        let properties =
            format!("{timer}KEYS\u{1}k-{body}\u{2}UNIQ_KEY\u{1}U-{body}\u{2}color\u{1}red\u{2}");
        let reply = send(&mut client, "Timed", 2, body, &properties).await;
        assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
        assert_eq!(reply.ext("queueId"), Some("2"), "{reply:?}");
    }
    // Parked, not in the real queue yet.
    assert!(records(&mut client, "Timed", 2).await.is_empty());

    let arrived = wait_records(&mut client, "Timed", 2, 3, Duration::from_secs(20)).await;
    assert_eq!(arrived.len(), 3);
    let wanted: HashMap<&str, i64> = [("at", 1_500), ("sec", 1_000), ("ms", 1_200)].into();
    for record in &arrived {
        let body = String::from_utf8_lossy(&record.body).into_owned();
        let due = sent_at + wanted[body.as_str()];
        assert!(
            record.store_timestamp_ms >= due,
            "{body} stored at {} before its time {due}",
            record.store_timestamp_ms
        );
        let properties = &record.properties;
        assert_eq!(
            property(properties, "KEYS"),
            Some(format!("k-{body}").as_str())
        );
        assert_eq!(
            property(properties, "UNIQ_KEY"),
            Some(format!("U-{body}").as_str())
        );
        assert_eq!(property(properties, "color"), Some("red"));
        for gone in [
            "REAL_TOPIC",
            "REAL_QID",
            "TIMER_DELIVER_MS",
            "TIMER_DELAY_SEC",
            "TIMER_DELAY_MS",
        ] {
            assert_eq!(property(properties, gone), None, "{gone} in {properties:?}");
        }
        let out: i64 = property(properties, "TIMER_OUT_MS")
            .and_then(|ms| ms.parse().ok())
            .unwrap_or_else(|| panic!("no TIMER_OUT_MS in {properties:?}"));
        assert!(
            (due..=record.store_timestamp_ms).contains(&out),
            "{body}: TIMER_OUT_MS {out} outside [{due}, {}]",
            record.store_timestamp_ms
        );
    }
    let metrics = broker.metrics().await;
    let fired = metrics
        .lines()
        .find(|line| line.starts_with("quiver_timers_fired_total{"))
        .unwrap_or_default();
    assert!(fired.ends_with(" 3"), "{metrics}");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_times_go_at_once_beyond_the_maximum_is_refused_and_a_delay_level_wins() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.timer_max_delay_ms = 60_000;
    let broker = TestBroker::start(config).await;
    let mut client = broker.client().await;
    client.create_topic("Timed", 1).await;
    let past = format!(
        "TIMER_DELIVER_MS\u{1}{}\u{2}",
        quiver_broker::now_ms() - 5_000
    );
    let reply = send(&mut client, "Timed", 0, "past", &past).await;
    assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
    // Stored to the real queue by the send itself.
    let now = records(&mut client, "Timed", 0).await;
    assert_eq!(now.len(), 1);

    let reply = send(
        &mut client,
        "Timed",
        0,
        "far",
        "TIMER_DELAY_SEC\u{1}61\u{2}",
    )
    .await;
    assert_eq!(reply.code, response::MESSAGE_ILLEGAL, "{reply:?}");
    assert!(reply
        .remark
        .unwrap_or_default()
        .contains("timer-max-delay-ms 60000"));
    let max = client
        .call(
            request::GET_MAX_OFFSET,
            ext(&[("topic", "rmq_sys_wheel_timer"), ("queueId", "0")]),
            Bytes::new(),
        )
        .await;
    assert!(matches!(max.ext("offset"), None | Some("0")), "{max:?}");
    assert_eq!(records(&mut client, "Timed", 0).await.len(), 1);

    // A delay level wins over a timer and clears it, as Apache's broker does.
    let both = "DELAY\u{1}1\u{2}TIMER_DELAY_SEC\u{1}30\u{2}";
    let reply = send(&mut client, "Timed", 0, "both", both).await;
    assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
    let arrived = wait_records(&mut client, "Timed", 0, 2, Duration::from_secs(20)).await;
    assert_eq!(property(&arrived[1].properties, "TIMER_DELAY_SEC"), None);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_half_message_is_delayed_from_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    client.create_topic("TxTimed", 1).await;
    let timed = send_half(
        &mut client,
        "PG",
        "TxTimed",
        0,
        "t",
        &[("TIMER_DELAY_MS", "1500")],
    )
    .await;
    assert_eq!(timed.code, response::SUCCESS, "{timed:?}");
    let leveled = send_half(&mut client, "PG", "TxTimed", 0, "d", &[("DELAY", "1")]).await;
    assert_eq!(leveled.code, response::SUCCESS, "{leveled:?}");
    let committed_at = quiver_broker::now_ms();
    for half in [&timed, &leveled] {
        let fields = end_fields("PG", half, TRANSACTION_COMMIT, false);
        let ended = client
            .call(request::END_TRANSACTION, fields, Bytes::new())
            .await;
        assert_eq!(ended.code, response::SUCCESS, "{ended:?}");
    }
    assert!(records(&mut client, "TxTimed", 0).await.is_empty());
    let arrived = wait_records(&mut client, "TxTimed", 0, 2, Duration::from_secs(20)).await;
    for record in arrived {
        let delay = if record.body.as_ref() == b"t" {
            1_500
        } else {
            1_000
        };
        assert!(
            record.store_timestamp_ms >= committed_at + delay,
            "{record:?}"
        );
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_thousand_timers_fire_once_each_none_early() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;
    client.create_topic("Many", 1).await;
    const COUNT: usize = 20_000;
    let mut due = HashMap::with_capacity(COUNT);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..COUNT {
        // xorshift: times spread over the 4 s after the next one, in no order.
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let at = quiver_broker::now_ms() + 1_000 + (seed % 4_000) as i64;
        let properties = format!("TIMER_DELIVER_MS\u{1}{at}\u{2}");
        let body = i.to_string();
        let reply = send(&mut client, "Many", 0, &body, &properties).await;
        assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
        due.insert(body, at);
    }
    let arrived = wait_records(&mut client, "Many", 0, COUNT, Duration::from_secs(120)).await;
    // Let a duplicate, if any, arrive too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let arrived_again = records(&mut client, "Many", 0).await;
    assert_eq!(arrived_again.len(), COUNT, "a timer fired twice");
    let mut seen = std::collections::HashSet::new();
    for record in &arrived {
        let body = String::from_utf8_lossy(&record.body).into_owned();
        assert!(record.store_timestamp_ms >= due[&body], "{body} early");
        assert!(seen.insert(body), "fired twice");
    }
    broker.stop().await;
}
