//! Sync, async, oneway and batch sends all land; key-hash sends of one key share a queue.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::TestBroker;
use quiver_client::{
    Message, PullConsumer, PullStatus, QueueOffset, QueueSelector, SendStatus, Subscription,
};
use tokio::sync::mpsc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_send_mode_stores_its_messages() {
    let broker = TestBroker::start().await;
    let topic = "modes";
    broker.create_topic(topic, 4).await;
    let producer = broker.producer();

    let sync = producer
        .send(
            Message::new(topic, "sync")
                .with_tags("A")
                .with_keys(["k1", "k2"])
                .with_property("color", "blue"),
        )
        .await
        .expect("sync");
    assert_eq!(sync.status, SendStatus::Ok);
    assert_eq!(sync.msg_id.len(), 32);

    let (tx, mut rx) = mpsc::unbounded_channel();
    producer.send_async(Message::new(topic, "async"), move |result| {
        let _ = tx.send(result);
    });
    let async_result = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("callback ran")
        .expect("sent");
    assert_eq!(async_result.expect("async send").status, SendStatus::Ok);

    producer
        .send_oneway(Message::new(topic, "oneway"))
        .await
        .expect("oneway");
    let batch = producer
        .send_batch(vec![
            Message::new(topic, "batch-0"),
            Message::new(topic, "batch-1"),
            Message::new(topic, "batch-2"),
        ])
        .await
        .expect("batch");
    assert_eq!(batch.msg_id.split(',').count(), 3);

    let mut hashed = BTreeSet::new();
    for i in 0..5 {
        let result = producer
            .send_with(
                Message::new(topic, format!("hashed-{i}")),
                QueueSelector::KeyHash("customer-7"),
            )
            .await
            .expect("hashed");
        hashed.insert(result.queue.queue_id);
    }
    assert_eq!(hashed.len(), 1, "one key spread over queues {hashed:?}");

    // Read every queue from the start until all 11 bodies are there (the oneway send has no
    // acknowledgement to wait for); properties arrive intact.
    let reader = PullConsumer::new(broker.client(), "reader");
    let all = Subscription::new(topic, "*");
    let mut bodies = Vec::new();
    let mut sync_seen = None;
    let started = std::time::Instant::now();
    while bodies.len() < 11 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "only found {bodies:?}"
        );
        bodies.clear();
        for queue in reader.queues(topic).await.expect("queues") {
            let mut offset = QueueOffset(0);
            loop {
                let result = reader
                    .pull(&queue, offset, 32, &all, None)
                    .await
                    .expect("pull");
                let PullStatus::Found(messages) = result.status else {
                    break;
                };
                for message in messages {
                    if &message.body[..] == b"sync" {
                        sync_seen = Some(message.clone());
                    }
                    bodies.push(String::from_utf8_lossy(&message.body).into_owned());
                }
                offset = result.next_begin_offset;
            }
        }
    }
    bodies.sort();
    assert_eq!(bodies.len(), 11, "{bodies:?}");
    let sync_seen = sync_seen.expect("sync message");
    assert_eq!(sync_seen.tags(), Some("A"));
    assert_eq!(sync_seen.keys(), vec!["k1", "k2"]);
    assert_eq!(sync_seen.property("color"), Some("blue"));
    assert_eq!(sync_seen.msg_id(), sync.msg_id);
    broker.stop().await;
}
