//! POP consumption through `Broker::pop` (the service the gRPC endpoint calls): receive and
//! ack, redelivery after the invisible time, change invisible, DLQ, in-order groups, filters,
//! long-poll wake-up, lag in GET_CONSUME_STATS, and a kill -9 between receive and ack.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{ext, test_config, wait_for, TestBroker};
use quiver_broker::broker::Broker;
use quiver_broker::filter::ConsumerFilter;
use quiver_broker::groups::SubscriptionGroupConfig;
use quiver_broker::pop::{PopError, Popped, ReceiveRequest};
use quiver_protocol::code::{request, response};
use quiver_protocol::message as msg;
use quiver_store::record::{decode, property, tags_code, Record};
use quiver_store::QueueOffset;

const GROUP: &str = "PopG";

fn record(popped: &Popped) -> Record {
    decode(&popped.record).expect("a stored record").0
}

fn body(popped: &Popped) -> String {
    String::from_utf8(record(popped).body.to_vec()).unwrap()
}

fn bodies(popped: &[Popped]) -> Vec<String> {
    popped.iter().map(body).collect()
}

async fn receive_with(
    broker: &Arc<Broker>,
    topic: &str,
    filter: &ConsumerFilter,
    max: usize,
    invisible: Duration,
    long_poll: Duration,
) -> Vec<Popped> {
    let req = ReceiveRequest {
        group: GROUP,
        topic,
        filter,
        max_messages: max,
        invisible,
        long_poll,
    };
    tokio::time::timeout(Duration::from_secs(30), broker.pop().receive(broker, req))
        .await
        .expect("a receive answers within its long poll")
        .expect("receive succeeds")
}

async fn receive(
    broker: &Arc<Broker>,
    topic: &str,
    max: usize,
    invisible: Duration,
) -> Vec<Popped> {
    receive_with(
        broker,
        topic,
        &ConsumerFilter::All,
        max,
        invisible,
        Duration::ZERO,
    )
    .await
}

/// Receives (long polling `wait`) until a message comes.
async fn receive_one_within(
    broker: &Arc<Broker>,
    topic: &str,
    invisible: Duration,
    wait: Duration,
) -> Popped {
    let got = receive_with(broker, topic, &ConsumerFilter::All, 1, invisible, wait).await;
    got.into_iter()
        .next()
        .expect("a message within the long poll")
}

fn ack(broker: &Broker, topic: &str, popped: &Popped) -> Result<(), PopError> {
    broker
        .pop()
        .ack(broker, GROUP, topic, &popped.receipt_handle)
}

fn set_group(broker: &Broker, retry_max_times: i32, orderly: bool) {
    broker.groups().upsert(SubscriptionGroupConfig {
        group_name: GROUP.into(),
        retry_max_times,
        consume_message_orderly: orderly,
        ..SubscriptionGroupConfig::default()
    });
}

/// The value of the series `name` whose labels contain `label`.
fn metric(metrics: &str, name: &str, label: &str) -> Option<u64> {
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))?;
    line.rsplit(' ').next()?.parse().ok()
}

async fn start(dir: &std::path::Path) -> (TestBroker, Arc<Broker>) {
    TestBroker::start_with_broker(test_config(dir)).await
}

async fn send_all(server: &TestBroker, topic: &str, queues: u32, bodies: &[&str], tags: &str) {
    let mut client = server.client().await;
    assert_eq!(
        client.create_topic(topic, queues).await.code,
        response::SUCCESS
    );
    for (i, text) in bodies.iter().enumerate() {
        let sent = client.send(topic, i as u32 % queues, text, tags).await;
        assert_eq!(sent.code, response::SUCCESS, "{sent:?}");
    }
}

/// (queue id, consumer offset, broker offset) of GET_CONSUME_STATS for GROUP on `topic`.
async fn consume_stats(server: &TestBroker, topic: &str) -> String {
    let mut client = server.client().await;
    let fields = ext(&[("consumerGroup", GROUP), ("topic", topic)]);
    let stats = client
        .call(request::GET_CONSUME_STATS, fields, Bytes::new())
        .await;
    assert_eq!(stats.code, response::SUCCESS);
    String::from_utf8_lossy(&stats.body).into_owned()
}

#[tokio::test]
async fn received_messages_are_acked_one_by_one_and_lag_follows_the_acked_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    send_all(&server, "T", 1, &["m0", "m1", "m2"], "a").await;
    let got = receive(&broker, "T", 32, Duration::from_secs(60)).await;
    assert_eq!(bodies(&got), ["m0", "m1", "m2"]);
    assert!(got
        .iter()
        .all(|p| p.delivery_attempt == 1 && p.topic == "T"));
    assert!(
        receive(&broker, "T", 32, Duration::from_secs(60))
            .await
            .is_empty(),
        "in flight"
    );

    ack(&broker, "T", &got[1]).unwrap();
    let stats = consume_stats(&server, "T").await;
    assert!(
        stats.contains(r#""consumerOffset":0"#) && stats.contains(r#""brokerOffset":3"#),
        "{stats}"
    );
    ack(&broker, "T", &got[0]).unwrap();
    assert_eq!(
        broker.offsets().query(GROUP, "T", 0),
        Some(QueueOffset(2)),
        "m0 and m1 acked"
    );
    assert!(matches!(
        ack(&broker, "T", &got[0]),
        Err(PopError::HandleExpired)
    ));
    assert!(matches!(
        broker.pop().ack(&broker, GROUP, "T", "not a handle"),
        Err(PopError::InvalidHandle)
    ));
    ack(&broker, "T", &got[2]).unwrap();
    let stats = consume_stats(&server, "T").await;
    assert!(stats.contains(r#""consumerOffset":3"#), "{stats}");
    assert_eq!(
        metric(
            &server.metrics().await,
            "quiver_pop_inflight_messages",
            r#"group="PopG""#
        ),
        Some(0)
    );
    let missing = ReceiveRequest {
        group: GROUP,
        topic: "Nope",
        filter: &ConsumerFilter::All,
        max_messages: 1,
        invisible: Duration::from_secs(1),
        long_poll: Duration::ZERO,
    };
    assert!(matches!(
        broker.pop().receive(&broker, missing).await,
        Err(PopError::TopicNotFound(_))
    ));
    server.stop().await;
}

#[tokio::test]
async fn a_batch_of_acks_answers_each_entry_and_commits_the_prefix_once() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    send_all(&server, "T", 2, &["m0", "m1", "m2", "m3", "m4"], "a").await;
    let got = receive(&broker, "T", 32, Duration::from_secs(60)).await;
    assert_eq!(got.len(), 5);
    let handle = |body: &str| {
        let popped = got.iter().find(|p| self::body(p) == body).unwrap();
        popped.receipt_handle.clone()
    };
    // m0 m2 m4 went to queue 0, m1 m3 to queue 1; m3 stays in flight.
    let handles = [
        handle("m2"),
        "not a handle".to_owned(),
        handle("m0"),
        handle("m1"),
        handle("m0"),
        handle("m4"),
    ];
    let results = broker.pop().ack_all(&broker, GROUP, "T", &handles);
    assert!(results[0].is_ok(), "{results:?}");
    assert!(matches!(results[1], Err(PopError::InvalidHandle)));
    assert!(results[2].is_ok() && results[3].is_ok() && results[5].is_ok());
    assert!(
        matches!(results[4], Err(PopError::HandleExpired)),
        "acked earlier in the batch"
    );
    assert_eq!(broker.offsets().query(GROUP, "T", 0), Some(QueueOffset(3)));
    assert_eq!(broker.offsets().query(GROUP, "T", 1), Some(QueueOffset(1)));
    let again = broker.pop().ack_all(&broker, GROUP, "T", &[handle("m3")]);
    assert!(again[0].is_ok());
    assert_eq!(broker.offsets().query(GROUP, "T", 1), Some(QueueOffset(2)));
    server.stop().await;
}

#[tokio::test]
async fn an_unacked_message_comes_back_from_the_retry_topic_with_attempt_two() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    send_all(&server, "T", 2, &["only"], "a").await;
    let first = receive(&broker, "T", 32, Duration::from_millis(300)).await;
    assert_eq!(bodies(&first), ["only"]);
    let original = record(&first[0]);
    let again = receive_one_within(
        &broker,
        "T",
        Duration::from_secs(60),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(body(&again), "only");
    assert_eq!(again.delivery_attempt, 2);
    assert_eq!(again.topic, "T");
    let retried = record(&again);
    assert_eq!(retried.topic, "%RETRY%PopG_T");
    assert_eq!(retried.reconsume_times, 1);
    assert_eq!(
        property(&retried.properties, msg::PROPERTY_RETRY_TOPIC),
        Some("T")
    );
    assert_eq!(
        property(&retried.properties, msg::PROPERTY_UNIQ_KEY),
        property(&original.properties, msg::PROPERTY_UNIQ_KEY),
        "the message id stays"
    );
    assert!(property(&retried.properties, msg::PROPERTY_ORIGIN_MESSAGE_ID).is_some());
    assert_eq!(retried.tags(), Some("a"));
    assert!(matches!(
        ack(&broker, "T", &first[0]),
        Err(PopError::HandleExpired)
    ));
    ack(&broker, "T", &again).unwrap();
    let revived = metric(
        &server.metrics().await,
        "quiver_pop_revived_total",
        r#"to="retry""#,
    );
    assert!(revived >= Some(1), "{revived:?}");
    server.stop().await;
}

#[tokio::test]
async fn change_invisible_extends_the_deadline_and_replaces_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    send_all(&server, "T", 1, &["slow"], "a").await;
    let got = receive(&broker, "T", 1, Duration::from_millis(500)).await;
    let handle = broker
        .pop()
        .change_invisible(
            &broker,
            GROUP,
            "T",
            &got[0].receipt_handle,
            Duration::from_secs(60),
        )
        .unwrap();
    assert_ne!(handle, got[0].receipt_handle);
    assert!(matches!(
        ack(&broker, "T", &got[0]),
        Err(PopError::HandleExpired)
    ));
    // Past the first deadline and two revive rounds: still invisible.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    assert!(receive(&broker, "T", 1, Duration::from_secs(60))
        .await
        .is_empty());
    broker.pop().ack(&broker, GROUP, "T", &handle).unwrap();
    assert_eq!(broker.offsets().query(GROUP, "T", 0), Some(QueueOffset(1)));
    server.stop().await;
}

#[tokio::test]
async fn after_retry_max_times_plus_one_deliveries_the_message_is_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    set_group(&broker, 1, false);
    send_all(&server, "T", 1, &["doomed", "forwarded"], "a").await;
    let first = receive(&broker, "T", 2, Duration::from_millis(200)).await;
    assert_eq!(bodies(&first), ["doomed", "forwarded"]);
    broker
        .pop()
        .forward_to_dead_letter(&broker, GROUP, "T", &first[1].receipt_handle)
        .unwrap();
    let second = receive_one_within(
        &broker,
        "T",
        Duration::from_millis(200),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!(
        (body(&second).as_str(), second.delivery_attempt),
        ("doomed", 2)
    );
    let dlq = format!("%DLQ%{GROUP}");
    wait_for("both in the DLQ", Duration::from_secs(15), || {
        let broker = broker.clone();
        let dlq = dlq.clone();
        async move { broker.store().max_offset(&dlq, 0) == QueueOffset(2) }
    })
    .await;
    let dead = broker
        .store()
        .get(&dlq, 0, QueueOffset(0), 8, 1 << 20, &|_| true)
        .unwrap();
    let dead: Vec<Record> = dead.messages.iter().map(|r| decode(r).unwrap().0).collect();
    let dead_bodies: Vec<&[u8]> = dead.iter().map(|r| &r.body[..]).collect();
    assert_eq!(dead_bodies, [&b"forwarded"[..], b"doomed"]);
    assert!(dead
        .iter()
        .all(|r| property(&r.properties, msg::PROPERTY_RETRY_TOPIC) == Some("T")));
    assert!(
        receive(&broker, "T", 8, Duration::from_secs(1))
            .await
            .is_empty(),
        "nothing comes back"
    );
    let revived = metric(
        &server.metrics().await,
        "quiver_pop_revived_total",
        r#"to="dlq""#,
    );
    assert!(revived >= Some(1), "{revived:?}");
    server.stop().await;
}

#[tokio::test]
async fn an_in_order_group_gets_its_batch_again_in_place_and_waits_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    set_group(&broker, 16, true);
    send_all(&server, "F", 1, &["f0", "f1", "f2"], "a").await;
    let batch = receive(&broker, "F", 2, Duration::from_millis(400)).await;
    assert_eq!(bodies(&batch), ["f0", "f1"]);
    assert!(
        receive(&broker, "F", 8, Duration::from_millis(400))
            .await
            .is_empty(),
        "blocked"
    );
    ack(&broker, "F", &batch[0]).unwrap();
    assert!(
        receive(&broker, "F", 8, Duration::from_millis(400))
            .await
            .is_empty(),
        "f1 still in flight"
    );
    let again = receive_one_within(
        &broker,
        "F",
        Duration::from_secs(60),
        Duration::from_secs(15),
    )
    .await;
    assert_eq!((body(&again).as_str(), again.delivery_attempt), ("f1", 2));
    assert_eq!(
        record(&again).topic,
        "F",
        "in place, not via the retry topic"
    );
    ack(&broker, "F", &again).unwrap();
    let next = receive(&broker, "F", 8, Duration::from_secs(60)).await;
    assert_eq!(bodies(&next), ["f2"]);
    let revived = metric(
        &server.metrics().await,
        "quiver_pop_revived_total",
        r#"to="fifo""#,
    );
    assert!(revived >= Some(1), "{revived:?}");
    server.stop().await;
}

#[tokio::test]
async fn a_tag_filter_delivers_its_tags_and_skipped_messages_count_as_done() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    let mut client = server.client().await;
    client.create_topic("T", 1).await;
    for (text, tag) in [("a0", "a"), ("b0", "b"), ("a1", "a"), ("b1", "b")] {
        client.send("T", 0, text, tag).await;
    }
    let only_a = ConsumerFilter::Tags(vec![tags_code("a")]);
    let got = receive_with(
        &broker,
        "T",
        &only_a,
        32,
        Duration::from_secs(60),
        Duration::ZERO,
    )
    .await;
    assert_eq!(bodies(&got), ["a0", "a1"]);
    for popped in &got {
        ack(&broker, "T", popped).unwrap();
    }
    assert_eq!(broker.offsets().query(GROUP, "T", 0), Some(QueueOffset(4)));
    server.stop().await;
}

#[tokio::test]
async fn a_long_polling_receive_wakes_when_a_message_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    send_all(&server, "T", 1, &[], "a").await;
    let receive = {
        let broker = broker.clone();
        tokio::spawn(async move {
            // Longer than the test's bound: only a wake-up answers it in time.
            let req = ReceiveRequest {
                group: GROUP,
                topic: "T",
                filter: &ConsumerFilter::All,
                max_messages: 4,
                invisible: Duration::from_secs(60),
                long_poll: Duration::from_secs(120),
            };
            broker.pop().receive(&broker, req).await
        })
    };
    wait_for("the receive waits", Duration::from_secs(10), || {
        let broker = broker.clone();
        async move { broker.pop().waiting_receives() == 1 }
    })
    .await;
    let waiting = metric(&server.metrics().await, "quiver_pop_waiting_receives", "");
    assert_eq!(waiting, Some(1));
    server.client().await.send("T", 0, "late", "a").await;
    let got = tokio::time::timeout(Duration::from_secs(20), receive)
        .await
        .expect("woken by the store's dispatch")
        .unwrap()
        .unwrap();
    assert_eq!(bodies(&got), ["late"]);
    server.stop().await;
}

/// Child process of `kill9_between_receive_and_ack`: receives two messages, acks one, says
/// so on stdout and waits to be killed.
#[tokio::test]
async fn kill9_child() {
    let Ok(dir) = std::env::var("QUIVER_POP_KILL9_DIR") else {
        return;
    };
    let (server, broker) = start(std::path::Path::new(&dir)).await;
    send_all(&server, "K", 1, &["acked", "unacked"], "a").await;
    let got = receive(&broker, "K", 2, Duration::from_secs(1)).await;
    assert_eq!(bodies(&got), ["acked", "unacked"]);
    ack(&broker, "K", &got[0]).unwrap();
    println!("RECEIVED-AND-ACKED");
    tokio::time::sleep(Duration::from_secs(120)).await;
    panic!("kill9_child was not killed");
}

#[tokio::test]
async fn kill9_between_receive_and_ack_redelivers_the_unacked_message_only() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "kill9_child",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("QUIVER_POP_KILL9_DIR", dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let said = tokio::task::spawn_blocking(move || {
        std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("RECEIVED-AND-ACKED"))
    });
    let said = tokio::time::timeout(Duration::from_secs(60), said).await;
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert!(matches!(said, Ok(Ok(true))), "the child received and acked");

    let (server, broker) = start(dir.path()).await;
    let again = receive_one_within(
        &broker,
        "K",
        Duration::from_secs(60),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        (body(&again).as_str(), again.delivery_attempt),
        ("unacked", 2)
    );
    ack(&broker, "K", &again).unwrap();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let after = receive(&broker, "K", 8, Duration::from_secs(60)).await;
    assert!(
        after.is_empty(),
        "the acked message never comes back: {:?}",
        bodies(&after)
    );
    server.stop().await;
}

#[tokio::test]
async fn a_cancelled_long_poll_stops_counting_as_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let (server, broker) = start(dir.path()).await;
    send_all(&server, "T", 1, &[], "a").await;
    let receive = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let req = ReceiveRequest {
                group: GROUP,
                topic: "T",
                filter: &ConsumerFilter::All,
                max_messages: 1,
                invisible: Duration::from_secs(60),
                long_poll: Duration::from_secs(120),
            };
            broker.pop().receive(&broker, req).await
        })
    };
    wait_for("the receive waits", Duration::from_secs(10), || {
        let broker = broker.clone();
        async move { broker.pop().waiting_receives() == 1 }
    })
    .await;
    receive.abort(); // a gRPC client going away drops the future
    wait_for("nothing waits", Duration::from_secs(10), || {
        let broker = broker.clone();
        async move { broker.pop().waiting_receives() == 0 }
    })
    .await;
    server.stop().await;
}

#[tokio::test]
async fn sync_flush_mode_receives_and_acks_and_keeps_them_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = || quiver_broker::BrokerConfig {
        flush_mode: quiver_broker::FlushMode::Sync,
        ..test_config(dir.path())
    };
    let (server, broker) = TestBroker::start_with_broker(config()).await;
    send_all(&server, "S", 1, &["s0", "s1"], "a").await;
    let got = receive(&broker, "S", 8, Duration::from_secs(60)).await;
    assert_eq!(bodies(&got), ["s0", "s1"]);
    ack(&broker, "S", &got[0]).unwrap();
    server.stop().await;
    drop(broker); // the store's directory lock goes with the last reference

    let (server, broker) = TestBroker::start_with_broker(config()).await;
    assert!(
        receive(&broker, "S", 8, Duration::from_secs(60))
            .await
            .is_empty(),
        "s1 is still in flight"
    );
    ack(&broker, "S", &got[1]).expect("a handle outlives a restart");
    assert_eq!(broker.offsets().query(GROUP, "S", 0), Some(QueueOffset(2)));
    server.stop().await;
}
