//! A queue stops pulling while it holds the maximum number of in-flight messages.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{produce, wait_until, TestBroker};
use parking_lot::Mutex;
use quiver_client::{ConsumeFromWhere, ConsumeOutcome, PushConsumer, ReceivedMessage};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_messages_stay_under_the_limit() {
    let broker = TestBroker::start().await;
    let topic = "throttled";
    broker.create_topic(topic, 1).await;
    let sent = produce(&broker.producer(), topic, "f", 40).await;

    // The listener consumes one message per permit the test hands out.
    let (permits, gate) = std::sync::mpsc::channel::<()>();
    let gate = Arc::new(Mutex::new(gate));
    let consumed: Arc<Mutex<usize>> = Arc::default();
    let counter = consumed.clone();
    let listener = Arc::new(move |batch: &[ReceivedMessage]| {
        for _ in batch {
            gate.lock().recv().expect("test still running");
        }
        *counter.lock() += batch.len();
        ConsumeOutcome::Success
    });
    let mut config = broker
        .consumer_config("g-flow", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    config.pull_batch_size = 5;
    config.max_in_flight_messages_per_queue = 10;
    config.consume_concurrency = 1;
    let consumer = PushConsumer::start(config, listener).await.expect("start");
    let queue = consumer
        .assigned_queues()
        .into_iter()
        .find(|q| q.topic == topic)
        .expect("assigned");
    let in_flight = || consumer.in_flight(&queue).map_or(0, |(count, _)| count);

    wait_until(
        "the queue to fill up to the limit",
        Duration::from_secs(10),
        || in_flight() >= 10,
    )
    .await;
    let mut highest = in_flight();
    for released in 1..=sent.len() {
        permits.send(()).expect("listener alive");
        wait_until("one more message consumed", Duration::from_secs(10), || {
            *consumed.lock() >= released
        })
        .await;
        highest = highest.max(in_flight());
    }
    assert_eq!(
        highest, 10,
        "in-flight messages went past the limit or never reached it"
    );
    consumer.shutdown().await.expect("shutdown");
    broker.stop().await;
}
