//! Orderly consumption keeps per-queue (and so per-key) order, also across retries.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, TestBroker};
use parking_lot::Mutex;
use quiver_client::{
    ConsumeFromWhere, ConsumeMode, ConsumeOutcome, Message, PushConsumer, QueueSelector,
    ReceivedMessage,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orderly_consumer_keeps_order_per_queue_and_key() {
    let broker = TestBroker::start().await;
    let topic = "ordered";
    broker.create_topic(topic, 4).await;
    let producer = broker.producer();
    let keys = 6;
    let per_key = 25;
    for seq in 0..per_key {
        for key in 0..keys {
            let key = format!("key-{key}");
            let message = Message::new(topic, format!("{key}:{seq}")).with_keys([key.as_str()]);
            producer
                .send_with(message, QueueSelector::KeyHash(&key))
                .await
                .expect("send");
        }
    }

    // Successes in the order they happened; every 7th message fails once first.
    let accepted: Arc<Mutex<Vec<ReceivedMessage>>> = Arc::default();
    let failed_once: Arc<Mutex<HashSet<String>>> = Arc::default();
    let (sink, failed) = (accepted.clone(), failed_once.clone());
    let listener = Arc::new(move |batch: &[ReceivedMessage]| {
        for message in batch {
            let body = String::from_utf8_lossy(&message.body).into_owned();
            if message.queue_offset.0 % 7 == 3 && failed.lock().insert(body) {
                return ConsumeOutcome::Retry;
            }
        }
        sink.lock().extend_from_slice(batch);
        ConsumeOutcome::Success
    });
    let config = broker
        .consumer_config("g-orderly", topic)
        .consume_from(ConsumeFromWhere::FirstOffset)
        .mode(ConsumeMode::Orderly);
    let consumer = PushConsumer::start(config, listener).await.expect("start");
    let total = keys * per_key;
    wait_until("every message in order", Duration::from_secs(30), || {
        accepted.lock().len() >= total
    })
    .await;
    consumer.shutdown().await.expect("shutdown");

    let accepted = accepted.lock().clone();
    assert_eq!(accepted.len(), total, "a message was consumed twice");
    let mut last_offset: BTreeMap<u32, u64> = BTreeMap::new();
    let mut last_seq: BTreeMap<String, i64> = BTreeMap::new();
    for message in &accepted {
        if let Some(previous) = last_offset.insert(message.queue.queue_id, message.queue_offset.0) {
            assert!(
                message.queue_offset.0 > previous,
                "queue {} went back from {previous} to {}",
                message.queue.queue_id,
                message.queue_offset
            );
        }
        let body = String::from_utf8_lossy(&message.body).into_owned();
        let (key, seq) = body.split_once(':').expect("key:seq");
        let seq: i64 = seq.parse().expect("seq");
        let previous = last_seq.insert(key.to_owned(), seq).unwrap_or(-1);
        assert_eq!(seq, previous + 1, "{key} out of order");
    }
    assert!(!failed_once.lock().is_empty(), "no retry was exercised");
    broker.stop().await;
}
