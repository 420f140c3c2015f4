//! A consumer killed mid-stream loses nothing: its successor starts at the committed offset.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{ConsumeFromWhere, PullConsumer, PushConsumer, QueueOffset, ReceivedMessage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_consumer_loses_nothing_and_successor_resumes_at_committed_offset() {
    let broker = TestBroker::start().await;
    let topic = "orders";
    broker.create_topic(topic, 4).await;
    let producer = broker.producer();
    let sent = produce(&producer, topic, "m", 400).await;

    let first = Received::default();
    let mut config = broker
        .consumer_config("g-kill", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    // Small pulls so the kill lands mid-stream.
    config.pull_batch_size = 4;
    config.consume_concurrency = 1;
    // A fast broker hands out all 400 before the test can react: past 100 the first consumer
    // slows down, so the kill lands mid-stream whatever the machine's speed.
    let record = first.listener();
    let slow_after_100 = first.clone();
    let listener: quiver_client::Listener =
        std::sync::Arc::new(move |batch: &[ReceivedMessage]| {
            if slow_after_100.len() >= 100 {
                std::thread::sleep(Duration::from_millis(20));
            }
            record(batch)
        });
    let consumer = PushConsumer::start(config.clone(), listener)
        .await
        .expect("start first");
    wait_until(
        "the first consumer to get going",
        Duration::from_secs(20),
        || first.len() >= 100,
    )
    .await;
    consumer.abort().await;

    // What the broker holds as committed once the dead consumer's last commits have landed.
    let offsets = PullConsumer::new(broker.client(), "g-kill");
    let queues = offsets.queues(topic).await.expect("queues");
    let mut committed: BTreeMap<u32, QueueOffset> = BTreeMap::new();
    let started = std::time::Instant::now();
    loop {
        let mut now = BTreeMap::new();
        for queue in &queues {
            let offset = offsets
                .committed_offset(queue)
                .await
                .expect("query")
                .unwrap_or(QueueOffset(0));
            now.insert(queue.queue_id, offset);
        }
        if now == committed {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "committed offsets never settled"
        );
        committed = now;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let second = Received::default();
    let successor = PushConsumer::start(config, second.listener())
        .await
        .expect("start second");
    let expected: HashSet<String> = sent.iter().cloned().collect();
    wait_until(
        "every message to be consumed by one of the two",
        Duration::from_secs(30),
        || {
            let mut seen: HashSet<String> = first.bodies().into_iter().collect();
            seen.extend(second.bodies());
            expected.is_subset(&seen)
        },
    )
    .await;
    successor.shutdown().await.expect("clean shutdown");

    // Redelivery starts exactly at the committed offset of each queue.
    let mut first_offsets: BTreeMap<u32, QueueOffset> = BTreeMap::new();
    for message in second
        .messages
        .lock()
        .iter()
        .filter(|m| m.queue.topic == topic)
    {
        let entry = first_offsets
            .entry(message.queue.queue_id)
            .or_insert(message.queue_offset);
        *entry = (*entry).min(message.queue_offset);
    }
    for (queue_id, offset) in &first_offsets {
        assert_eq!(
            Some(offset),
            committed.get(queue_id),
            "queue {queue_id} restarted away from its committed offset"
        );
    }
    assert!(
        first.len() < sent.len(),
        "the kill happened after everything was consumed"
    );
    broker.stop().await;
}
